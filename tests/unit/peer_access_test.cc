// Per-allocation peer access on the simulated driver: policies, granules
// grouped by access set, batching, explicit grants, nesting, statistics.
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class PeerAccessTest : public SimTest {
 protected:
  void SetUp() override { StartSim(4); }
  std::unique_ptr<ShimCore> Make(PeerPolicy policy) {
    AllocatorOptions o;
    o.peer_policy = std::move(policy);
    return std::make_unique<ShimCore>(api_, o);
  }
  static PeerPolicy Kind(PeerPolicy::Kind k, size_t min_bytes = 0) {
    PeerPolicy p;
    p.kind = k;
    p.min_bytes = min_bytes;
    return p;
  }
  CUdeviceptr Alloc(Allocator& a, size_t bytes, const std::string& tag = "") {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes, tag);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }
  // A simulated kernel on `device` reads the first and last byte.
  static bool CanRead(int device, CUdeviceptr p, size_t bytes) {
    char c;
    return sim::DeviceRead(device, &c, p, 1) == CUDA_SUCCESS &&
           sim::DeviceRead(device, &c, p + bytes - 1, 1) == CUDA_SUCCESS;
  }
};

TEST_F(PeerAccessTest, AllGrantsExistingAndFutureAllocationsOnEnable) {
  auto core = Make(Kind(PeerPolicy::Kind::kAll));
  MakeCurrent(1);
  CUdeviceptr small = Alloc(core->allocator(), 4096), large = Alloc(core->allocator(), 8 * kMiB);
  EXPECT_FALSE(CanRead(0, small, 4096));  // nothing before the enable
  EXPECT_FALSE(CanRead(0, large, 8 * kMiB));
  ASSERT_TRUE(core->peers().EnablePeer(0, 1).ok());
  EXPECT_TRUE(CanRead(0, small, 4096));
  EXPECT_TRUE(CanRead(0, large, 8 * kMiB));
  EXPECT_FALSE(CanRead(2, large, 8 * kMiB));  // only the peer that enabled
  CUdeviceptr later = Alloc(core->allocator(), 3 * kMiB);
  EXPECT_TRUE(CanRead(0, later, 3 * kMiB));
  ASSERT_TRUE(core->peers().DisablePeer(0, 1).ok());
  for (auto [p, n] : {std::pair{small, size_t{4096}}, {large, 8 * kMiB}, {later, 3 * kMiB}}) {
    EXPECT_FALSE(CanRead(0, p, n));
    EXPECT_TRUE(CanRead(1, p, n));  // the owner keeps access
  }
  EXPECT_EQ(sim::PeerMappedBytes(0), 0u);
}

TEST_F(PeerAccessTest, NoneGrantsNothing) {
  auto core = Make(Kind(PeerPolicy::Kind::kNone));
  MakeCurrent(1);
  CUdeviceptr small = Alloc(core->allocator(), 4096), large = Alloc(core->allocator(), 8 * kMiB);
  ASSERT_TRUE(core->peers().EnablePeer(0, 1).ok());
  EXPECT_FALSE(CanRead(0, small, 4096));
  EXPECT_FALSE(CanRead(0, large, 8 * kMiB));
  EXPECT_EQ(sim::PeerMappedBytes(0), 0u);
  const DeviceStats st = core->control().GetStats().devices[0];
  EXPECT_EQ(st.device, 1);
  EXPECT_EQ(st.peers[0].denials, 2u);
  EXPECT_EQ(st.peers[0].grants, 0u);
}

TEST_F(PeerAccessTest, MinSizeSeparatesGranulesByAccessSet) {
  auto core = Make(Kind(PeerPolicy::Kind::kMinSize, 64 * 1024));
  MakeCurrent(2);
  ASSERT_TRUE(core->peers().EnablePeer(3, 2).ok());
  std::vector<std::pair<CUdeviceptr, size_t>> allowed, denied;
  for (int i = 0; i < 200; ++i) {  // interleaved small and not-so-small packed requests
    size_t bytes = i % 2 ? 1000 + i : 64 * 1024 + i;
    CUdeviceptr p = Alloc(core->allocator(), bytes);
    (bytes >= 64 * 1024 ? allowed : denied).push_back({p, bytes});
  }
  CUdeviceptr big = Alloc(core->allocator(), 16 * kMiB);
  allowed.push_back({big, 16 * kMiB});
  for (auto [p, n] : allowed) EXPECT_TRUE(CanRead(3, p, n)) << n;
  for (auto [p, n] : denied) EXPECT_FALSE(CanRead(3, p, n)) << n;
  // No granule mixes the two sets.
  for (auto [p, n] : denied) {
    for (auto [q, m] : allowed) {
      EXPECT_NE(core->allocator().Find(p)->range_base, core->allocator().Find(q)->range_base);
    }
  }
}

TEST_F(PeerAccessTest, RulesMatchOwnerPeerSizeAndTag) {
  PeerPolicy p;
  p.kind = PeerPolicy::Kind::kRules;
  PeerRule kv;
  kv.owner = 0;
  kv.peers = {1};
  kv.tag = "kv";
  kv.allow = true;
  PeerRule big;
  big.min_bytes = 32 * kMiB;
  big.allow = true;
  p.rules = {kv, big};
  p.default_allow = false;
  p.rules_file = "test.toml";
  auto core = Make(p);
  MakeCurrent(0);
  ASSERT_TRUE(core->peers().EnablePeer(1, 0).ok());
  ASSERT_TRUE(core->peers().EnablePeer(2, 0).ok());
  CUdeviceptr tagged = Alloc(core->allocator(), 4096, "kv"), plain = Alloc(core->allocator(), 4096);
  CUdeviceptr huge = Alloc(core->allocator(), 32 * kMiB);
  EXPECT_TRUE(CanRead(1, tagged, 4096));
  EXPECT_FALSE(CanRead(2, tagged, 4096));  // the kv rule names peer 1 only
  EXPECT_FALSE(CanRead(1, plain, 4096));
  EXPECT_TRUE(CanRead(1, huge, 32 * kMiB));
  EXPECT_TRUE(CanRead(2, huge, 32 * kMiB));
  EXPECT_NE(core->allocator().Find(tagged)->range_base, core->allocator().Find(plain)->range_base);
}

TEST_F(PeerAccessTest, EnableIsBatchedIntoContiguousRuns) {
  auto core = Make(Kind(PeerPolicy::Kind::kAll));
  MakeCurrent(0);
  std::vector<CUdeviceptr> ptrs;
  for (int i = 0; i < 50; ++i) ptrs.push_back(Alloc(core->allocator(), 3 * kMiB));
  for (int i = 0; i < 2000; ++i) ptrs.push_back(Alloc(core->allocator(), 512));
  sim::ResetCallCounts();
  ASSERT_TRUE(core->peers().EnablePeer(1, 0).ok());
  // 50 large blocks and one granule, adjacent in one reservation: one call.
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 1u);
  ASSERT_TRUE(core->peers().EnablePeer(2, 0).ok());
  ASSERT_TRUE(core->peers().EnablePeer(3, 0).ok());
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 3u);
  // A new block is granted to the owner and all three peers in one call.
  sim::ResetCallCounts();
  CUdeviceptr p = Alloc(core->allocator(), 5 * kMiB);
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 1u);
  for (int d = 0; d < 4; ++d) EXPECT_TRUE(CanRead(d, p, 5 * kMiB));
  // A hole (a freed and released block) splits the run in two.
  ASSERT_TRUE(core->allocator().Free(ptrs[10]).ok());
  ASSERT_EQ(core->control().Trim(), 4 * kMiB);
  sim::ResetCallCounts();
  ASSERT_TRUE(core->peers().DisablePeer(2, 0).ok());
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 2u);
  EXPECT_FALSE(CanRead(2, ptrs[0], 3 * kMiB));
  EXPECT_TRUE(CanRead(3, ptrs[0], 3 * kMiB));
}

TEST_F(PeerAccessTest, EnablesNestAndDisableWithoutEnableFails) {
  auto core = Make(Kind(PeerPolicy::Kind::kAll));
  MakeCurrent(0);
  CUdeviceptr p = Alloc(core->allocator(), 4 * kMiB);
  ASSERT_TRUE(core->peers().EnablePeer(1, 0).ok());
  ASSERT_TRUE(core->peers().EnablePeer(1, 0).ok());
  ASSERT_TRUE(core->peers().DisablePeer(1, 0).ok());
  EXPECT_TRUE(CanRead(1, p, 4 * kMiB));
  ASSERT_TRUE(core->peers().DisablePeer(1, 0).ok());
  EXPECT_FALSE(CanRead(1, p, 4 * kMiB));
  EXPECT_EQ(ToCuResult(core->peers().DisablePeer(1, 0)), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
}

TEST_F(PeerAccessTest, FailedGrantDuringEnableLeavesNothingGranted) {
  auto core = Make(Kind(PeerPolicy::Kind::kAll));
  MakeCurrent(0);
  CUdeviceptr p = Alloc(core->allocator(), 4 * kMiB);
  sim::FailCall("cuMemSetAccess", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(ToCuResult(core->peers().EnablePeer(1, 0)), CUDA_ERROR_UNKNOWN);
  EXPECT_FALSE(CanRead(1, p, 4 * kMiB));
  CUdeviceptr q = Alloc(core->allocator(), 4 * kMiB);  // not enabled: not granted
  EXPECT_FALSE(CanRead(1, q, 4 * kMiB));
  ASSERT_TRUE(core->peers().EnablePeer(1, 0).ok());  // a retry works
  EXPECT_TRUE(CanRead(1, p, 4 * kMiB));
  EXPECT_TRUE(CanRead(1, q, 4 * kMiB));
}

TEST_F(PeerAccessTest, ExplicitGrantAndRevokeOverrideThePolicy) {
  auto core = Make(Kind(PeerPolicy::Kind::kNone));
  MakeCurrent(0);
  CUdeviceptr large = Alloc(core->allocator(), 4 * kMiB);
  ASSERT_TRUE(core->peers().SetPeerAccess(large + 100, 2, true).ok());  // interior pointers name the allocation
  EXPECT_TRUE(CanRead(2, large, 4 * kMiB));        // no enable needed
  EXPECT_TRUE(core->peers().PeerHasAccess(large, 2).value());
  EXPECT_FALSE(core->peers().PeerHasAccess(large, 1).value());
  ASSERT_TRUE(core->peers().SetPeerAccess(large, 2, false).ok());
  EXPECT_FALSE(CanRead(2, large, 4 * kMiB));
  // Under "all", a revoke holds across enables.
  auto b = Make(Kind(PeerPolicy::Kind::kAll));
  CUdeviceptr other = Alloc(b->allocator(), 4 * kMiB);
  ASSERT_TRUE(b->peers().SetPeerAccess(other, 1, false).ok());
  ASSERT_TRUE(b->peers().EnablePeer(1, 0).ok());
  EXPECT_FALSE(CanRead(1, other, 4 * kMiB));
  EXPECT_TRUE(core->peers().SetPeerAccess(large, 0, true).ok());  // the owner: a no-op
  EXPECT_EQ(ToCuResult(core->peers().SetPeerAccess(large, 9, true)), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(ToCuResult(core->peers().SetPeerAccess(0x1234, 1, true)), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(PeerAccessTest, ExplicitGrantOnPackedAllocationFollowsTheGranuleRule) {
  auto core = Make(Kind(PeerPolicy::Kind::kNone));
  MakeCurrent(0);
  CUdeviceptr first = Alloc(core->allocator(), 4096), neighbour = Alloc(core->allocator(), 4096);
  ASSERT_EQ(core->allocator().Find(first)->range_base, core->allocator().Find(neighbour)->range_base);
  // Granting `first` would expose `neighbour`: refused.
  EXPECT_EQ(ToCuResult(core->peers().SetPeerAccess(first, 1, true)), CUDA_ERROR_NOT_PERMITTED);
  EXPECT_FALSE(CanRead(1, first, 4096));
  // Alone in its granule: granted, and the granule is sealed.
  ASSERT_TRUE(core->allocator().Free(neighbour).ok());
  ASSERT_TRUE(core->peers().SetPeerAccess(first, 1, true).ok());
  EXPECT_TRUE(CanRead(1, first, 4096));
  CUdeviceptr next = Alloc(core->allocator(), 4096);
  EXPECT_NE(core->allocator().Find(next)->range_base, core->allocator().Find(first)->range_base);
  EXPECT_FALSE(CanRead(1, next, 4096));
  // Tagged allocations share their granule's explicit grants, by design.
  CUdeviceptr t1 = Alloc(core->allocator(), 4096, "shared"), t2 = Alloc(core->allocator(), 4096, "shared");
  ASSERT_TRUE(core->peers().SetPeerAccess(t1, 3, true).ok());
  EXPECT_TRUE(CanRead(3, t2, 4096));
  EXPECT_FALSE(CanRead(3, next, 4096));
}

TEST_F(PeerAccessTest, ExplicitGrantNeedsPeerCapability) {
  sim::SimOptions o;
  o.device_count = 4;
  o.pairs_without_p2p = {{0, 3}};
  sim::Reset(o);
  ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
  auto core = Make(Kind(PeerPolicy::Kind::kNone));
  MakeCurrent(0);
  CUdeviceptr p = Alloc(core->allocator(), 4 * kMiB);
  EXPECT_EQ(ToCuResult(core->peers().SetPeerAccess(p, 3, true)), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
  EXPECT_FALSE(CanRead(3, p, 4 * kMiB));
  EXPECT_TRUE(core->peers().SetPeerAccess(p, 2, true).ok());
  const DeviceStats st = core->control().GetStats().devices[0];
  EXPECT_EQ(st.peers[2].grants, 1u);  // explicit grants are counted too
  EXPECT_EQ(st.peers[2].peak_mapped_bytes, 4 * kMiB);
}

TEST_F(PeerAccessTest, StatisticsCountGrantsDenialsAndMappedBytes) {
  auto core = Make(Kind(PeerPolicy::Kind::kMinSize, 2 * kMiB));
  MakeCurrent(1);
  ASSERT_TRUE(core->peers().EnablePeer(0, 1).ok());
  Alloc(core->allocator(), 4096);
  Alloc(core->allocator(), 4 * kMiB);
  Alloc(core->allocator(), 6 * kMiB);
  const DeviceStats st = core->control().GetStats().devices[0];
  EXPECT_EQ(st.allocations, 3u);
  EXPECT_EQ(st.peers[0].grants, 2u);
  EXPECT_EQ(st.peers[0].denials, 1u);
  EXPECT_EQ(st.peers[0].mapped_bytes, 10 * kMiB);
  EXPECT_EQ(st.peers[0].mapped_bytes, sim::PeerMappedBytes(0));
  EXPECT_EQ(st.handle_bytes, 12 * kMiB);
}

}  // namespace
}  // namespace vmmshim

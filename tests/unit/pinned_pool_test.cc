// The pinned pool (core/heap/pinned_pool.h) and pauses that copy into it, on
// the simulated driver: ranges are handed out and coalesced back; a pause
// with contents copies into the pool on the copier's own stream, with no
// pinning of its own, and the data comes back whole; contents beyond the
// pool go to new host memory; a pool that failed to fill, or a copy that
// failed, leaves pauses working or refused with nothing paused. The pool is
// registered in chunks, copies are cut at their ends (the simulated driver
// refuses a copy across two registrations, as the H200's does), and a deep
// sleep's Unpin gives every registration back, which the next copies take
// again as they go.
#include <cstring>
#include <thread>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "core/heap/pinned_pool.h"
#include "core/report/residency.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class PinnedPoolTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(1, 512 * kMiB);
    MakeCurrent(0);
  }
  CUcontext Current() {
    CUcontext c = nullptr;
    api_.cuCtxGetCurrent(&c);
    return c;
  }
  // The pinned pool serves pauses whose memory faults while paused (and the
  // deep sleep's): VMMSHIM_PAUSED_ACCESS=fault.
  AllocatorOptions WithPool(size_t bytes, size_t chunk_bytes = size_t{1} << 30) {
    AllocatorOptions o = FaultingPauses();
    o.pinned_pool_bytes = bytes;
    o.pinned_pool_chunk_bytes = chunk_bytes;
    return o;
  }
  CUdeviceptr Alloc(Allocator& a, size_t bytes, const std::string& tag) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes, tag);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }
};

TEST(PinnedPoolLimits, APoolIsCutToWhatTheHostHasLeft) {
  constexpr size_t kGiB = size_t{1} << 30;
  HostMemoryHeadroom plenty;
  plenty.bytes = 64 * kGiB;
  EXPECT_EQ(PinnedPool::AllowedBytes(20 * kGiB, plenty), 20 * kGiB);
  // A 1 GiB memory cgroup with 64 MiB in use: 2 GiB asked, 3/4 of the rest.
  HostMemoryHeadroom cgroup;
  cgroup.bytes = kGiB - (size_t{64} << 20);
  const size_t cut = PinnedPool::AllowedBytes(2 * kGiB, cgroup);
  EXPECT_LE(cut, cgroup.bytes / 4 * 3);
  EXPECT_GT(cut, 0u);
  EXPECT_EQ(cut % PinnedPool::kAlignment, 0u);
  // The largest byte count a variable can say does not wrap to 0.
  EXPECT_EQ(PinnedPool::AllowedBytes(SIZE_MAX, plenty), 48 * kGiB);
  HostMemoryHeadroom unknown;  // nothing could be read
  EXPECT_GT(PinnedPool::AllowedBytes(SIZE_MAX, unknown), 0u);
  EXPECT_LT(PinnedPool::AllowedBytes(SIZE_MAX, unknown), SIZE_MAX - PinnedPool::kAlignment);
  HostMemoryHeadroom none;
  none.bytes = 1 << 20;  // less than one huge page's 3/4
  EXPECT_EQ(PinnedPool::AllowedBytes(kGiB, none), 0u);
}

TEST_F(PinnedPoolTest, RangesAreHandedOutWholeAndCoalescedBack) {
  PinnedPool pool(api_);
  EXPECT_EQ(pool.Take(kMiB), nullptr);  // never started
  pool.Start(8 * kMiB, Current(), 2);
  char* a = pool.Take(3 * kMiB);  // rounded up to 4 MiB
  char* b = pool.Take(2 * kMiB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b, a + 4 * kMiB);
  EXPECT_EQ(pool.Take(4 * kMiB), nullptr);  // 2 MiB left
  std::memset(a, 1, 3 * kMiB);  // the memory is the taker's
  EXPECT_EQ(pool.stats().bytes, 8 * kMiB);
  EXPECT_EQ(pool.stats().free_bytes, 2 * kMiB);
  pool.Give(a, 3 * kMiB);
  pool.Give(b, 2 * kMiB);
  EXPECT_EQ(pool.stats().free_bytes, 8 * kMiB);
  EXPECT_EQ(pool.Take(8 * kMiB), a);  // whole again
  EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 1u);  // one registration
}

TEST_F(PinnedPoolTest, APauseCopiesIntoThePoolOnItsOwnStreamAndBackWhole) {
  ShimCore shim(api_, WithPool(64 * kMiB));
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 24 * kMiB, "kv");
  const CUdeviceptr w = Alloc(a, 6 * kMiB, "weights");
  Fill(kv, 24 * kMiB, 3);
  Fill(w, 6 * kMiB, 4);
  // The pool was started at the first allocation, in the background.
  EXPECT_EQ(shim.pause().pinned_pool_stats().bytes, 64 * kMiB);  // waits for the fill
  sim::ResetCallCounts();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 0u);  // nothing pinned at the pause
  EXPECT_GE(sim::CallCount("cuMemcpyDtoHAsync_v2"), 2u);
  EXPECT_EQ(sim::CallCount("cuMemcpyDtoH_v2"), 0u);  // no staging ring
  EXPECT_EQ(shim.pause().pinned_pool_stats().free_bytes, 64 * kMiB - 30 * kMiB);
  // The residency report says so too.
  const nlohmann::json pool = nlohmann::json::parse(ResidencyJson(shim.control(), nullptr)).at("pinned_pool");
  EXPECT_EQ(pool.at("bytes").get<size_t>(), 64 * kMiB);
  EXPECT_EQ(pool.at("free_bytes").get<size_t>(), 34 * kMiB);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_GE(sim::CallCount("cuMemcpyHtoDAsync_v2"), 2u);
  EXPECT_TRUE(Holds(kv, 24 * kMiB, 3));
  EXPECT_TRUE(Holds(w, 6 * kMiB, 4));
  EXPECT_EQ(shim.pause().pinned_pool_stats().free_bytes, 64 * kMiB);  // all given back
  EXPECT_EQ(sim::CallCount("cuStreamCreate"), sim::CallCount("cuStreamDestroy_v2"));
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(PinnedPoolTest, APauseFromAThreadWithoutAContextUsesThePool) {
  // The control socket's thread (a deep sleep) has no current context.
  ShimCore shim(api_, WithPool(16 * kMiB));
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  Fill(kv, 4 * kMiB, 11);
  shim.pause().pinned_pool_stats();  // filled
  sim::ResetCallCounts();
  absl::Status paused, resumed;
  std::thread([&] {
    paused = shim.pause().Pause(TagSelection::All(), true).status();
    resumed = shim.pause().Resume(TagSelection::All()).status();
  }).join();
  ASSERT_TRUE(paused.ok()) << paused;
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_GE(sim::CallCount("cuMemcpyDtoHAsync_v2"), 1u);
  EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 0u);  // the pool's, not pinned again
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 11));
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(PinnedPoolTest, ContentsBeyondThePoolGoToNewHostMemory) {
  ShimCore shim(api_, WithPool(8 * kMiB));
  Allocator& a = shim.allocator();
  const CUdeviceptr big = Alloc(a, 32 * kMiB, "kv");
  const CUdeviceptr small = Alloc(a, 4 * kMiB, "weights");
  Fill(big, 32 * kMiB, 5);
  Fill(small, 4 * kMiB, 6);
  sim::ResetCallCounts();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  EXPECT_GE(sim::CallCount("cuMemcpyDtoHAsync_v2"), 1u);  // the small one, in the pool
  EXPECT_GE(sim::CallCount("cuMemcpyDtoH_v2"), 1u);       // the big one, by the ring
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Holds(big, 32 * kMiB, 5));
  EXPECT_TRUE(Holds(small, 4 * kMiB, 6));
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(PinnedPoolTest, APoolThatCouldNotBePinnedLeavesPausesAsWithoutIt) {
  sim::FailCall("cuMemHostRegister_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);  // the pool's
  ShimCore shim(api_, WithPool(16 * kMiB));
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  Fill(kv, 4 * kMiB, 7);
  EXPECT_EQ(shim.pause().pinned_pool_stats().bytes, 0u);  // the fill ended, failed
  sim::ResetCallCounts();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  EXPECT_GE(sim::CallCount("cuMemcpyDtoH_v2"), 1u);  // through the staging ring
  EXPECT_EQ(sim::CallCount("cuMemcpyDtoHAsync_v2"), 0u);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 7));
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(PinnedPoolTest, AFailedCopyIntoThePoolPausesNothing) {
  ShimCore shim(api_, WithPool(32 * kMiB));
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 4 * kMiB, "kv");
  const CUdeviceptr w = Alloc(a, 4 * kMiB, "weights");
  Fill(kv, 4 * kMiB, 8);
  Fill(w, 4 * kMiB, 9);
  ASSERT_EQ(shim.pause().pinned_pool_stats().bytes, 32 * kMiB);  // waits for nothing: filled
  sim::FailCall("cuMemcpyDtoHAsync_v2", 2, CUDA_ERROR_LAUNCH_FAILED);
  absl::StatusOr<size_t> paused = shim.pause().Pause(TagSelection::All(), true);
  EXPECT_EQ(ToCuResult(paused.status()), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(shim.pause().pinned_pool_stats().free_bytes, 32 * kMiB);  // backups given back
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 8));  // live, untouched
  EXPECT_TRUE(Holds(w, 4 * kMiB, 9));
  sim::ClearFailures();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  sim::FailCall("cuMemcpyHtoDAsync_v2", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_FALSE(shim.pause().Resume(TagSelection::All()).ok());  // stays paused, copies kept
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Holds(kv, 4 * kMiB, 8));
  EXPECT_TRUE(Holds(w, 4 * kMiB, 9));
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(PinnedPoolTest, CopiesAreCutWhereTheRegistrationsEnd) {
  ShimCore shim(api_, WithPool(64 * kMiB, 4 * kMiB));
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 26 * kMiB, "kv");  // ranges across several chunks
  const CUdeviceptr w = Alloc(a, 6 * kMiB, "weights");
  Fill(kv, 26 * kMiB, 12);
  Fill(w, 6 * kMiB, 13);
  EXPECT_EQ(shim.pause().pinned_pool_stats().pinned_bytes, 64 * kMiB);
  EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 16u);  // one per 4 MiB chunk
  sim::ResetCallCounts();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 0u);
  EXPECT_GE(sim::CallCount("cuMemcpyDtoHAsync_v2"), 8u);  // 32 MiB in parts of one chunk
  EXPECT_EQ(sim::CallCount("cuMemcpyDtoH_v2"), 0u);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Holds(kv, 26 * kMiB, 12));
  EXPECT_TRUE(Holds(w, 6 * kMiB, 13));
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(PinnedPoolTest, UnpinGivesThePinningBackAndTheCopiesTakeWhatTheyUse) {
  ShimCore shim(api_, WithPool(64 * kMiB, 4 * kMiB));
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 24 * kMiB, "kv");
  const CUdeviceptr w = Alloc(a, 6 * kMiB, "weights");
  Fill(kv, 24 * kMiB, 14);
  Fill(w, 6 * kMiB, 15);
  shim.pause().pinned_pool_stats();  // filled
  const size_t registrations = sim::LiveHostRegistrations();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  // A deep sleep's step before the driver's checkpoint, from the control
  // socket's thread (no context of its own).
  size_t unpinned = 0;
  std::thread([&] { unpinned = shim.pause().UnpinPinnedPool(); }).join();
  EXPECT_EQ(unpinned, 64 * kMiB);
  EXPECT_EQ(sim::LiveHostRegistrations(), registrations - 16);
  EXPECT_EQ(shim.pause().pinned_pool_stats().pinned_bytes, 0u);
  EXPECT_EQ(shim.pause().UnpinPinnedPool(), 0u);  // nothing left to give back
  sim::ResetCallCounts();
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  // 30 MiB of ranges (rounded to 2 MiB) lie in the first 8 chunks: only
  // those were pinned again, each before its copies.
  EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 8u);
  EXPECT_EQ(shim.pause().pinned_pool_stats().pinned_bytes, 32 * kMiB);
  EXPECT_TRUE(Holds(kv, 24 * kMiB, 14));
  EXPECT_TRUE(Holds(w, 6 * kMiB, 15));
  // The next pause finds them pinned.
  sim::ResetCallCounts();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  EXPECT_EQ(sim::CallCount("cuMemHostRegister_v2"), 0u);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Holds(kv, 24 * kMiB, 14));
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

TEST_F(PinnedPoolTest, AChunkThatCannotBePinnedAgainLeavesTheResumeToBeRetried) {
  ShimCore shim(api_, WithPool(32 * kMiB, 4 * kMiB));
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 12 * kMiB, "kv");
  Fill(kv, 12 * kMiB, 16);
  shim.pause().pinned_pool_stats();
  ASSERT_TRUE(shim.pause().Pause(TagSelection::All(), true).ok());
  ASSERT_EQ(shim.pause().UnpinPinnedPool(), 32 * kMiB);
  // (Not OUT_OF_MEMORY: that one is retried once after the caches go.)
  sim::FailCall("cuMemHostRegister_v2", 2, CUDA_ERROR_NOT_PERMITTED);
  absl::StatusOr<size_t> resumed = shim.pause().Resume(TagSelection::All());
  EXPECT_EQ(ToCuResult(resumed.status()), CUDA_ERROR_NOT_PERMITTED);  // the driver's code
  EXPECT_GT(shim.control().GetStats().paused_bytes, 0u);  // still paused, its copy kept
  sim::ClearFailures();
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Holds(kv, 12 * kMiB, 16));
  ASSERT_TRUE(shim.ReleaseAll().ok());
}

}  // namespace
}  // namespace vmmshim

// What a pause selects beyond one tag's cudaMalloc memory, on the simulated
// driver: stream-ordered memory (live and freed blocks waiting for reuse),
// "everything but these tags" (TagSelection::AllExcept), repeats that do
// nothing, faults at the new driver calls, and the residency report that
// says what is left (core/report/residency.h).
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "core/heap/tag_selection.h"
#include "core/report/residency.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class PauseSelectionTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2, 256 * kMiB);
    MakeCurrent(0);
    ASSERT_EQ(sim::cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  static CUdeviceptr Alloc(Allocator& a, size_t bytes, const std::string& tag) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes, tag);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }
  CUdeviceptr AllocAsync(ShimCore& shim, size_t bytes, const std::string& tag) {
    absl::StatusOr<Allocator::Allocation> r =
        shim.stream_ordered().AllocateAsync(bytes, stream_, false, nullptr, tag);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }
  static bool Readable(CUdeviceptr p) {
    char c;
    return sim::DeviceRead(0, &c, p, 1) == CUDA_SUCCESS;
  }
  static void Teardown(ShimCore& shim) {
    shim.control().Trim();
    ASSERT_TRUE(shim.ReleaseAll().ok());
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    EXPECT_EQ(sim::GetUsage().mappings, 0u);
    EXPECT_EQ(sim::LiveHostAllocations(), 0u);
  }

  CUstream stream_ = nullptr;
};

TEST_F(PauseSelectionTest, StreamOrderedMemoryIsPausedAndResumedWithItsContents) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr big = AllocAsync(shim, 8 * kMiB, "kv");
  const CUdeviceptr small = AllocAsync(shim, 1000, "kv");
  const CUdeviceptr other = AllocAsync(shim, 4 * kMiB, "");
  Fill(big, 8 * kMiB, 1);
  Fill(small, 1000, 2);
  Fill(other, 4 * kMiB, 3);
  const size_t free_before = FreeMemory();
  sim::HoldStream(stream_);  // work pending on the memory: the pause waits for it
  absl::StatusOr<size_t> released = shim.pause().Pause(TagSelection::Only("kv"), true);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_GE(*released, 8 * kMiB + 2 * kMiB);
  EXPECT_EQ(FreeMemory(), free_before + *released);
  // Addressable while paused: the kept contents, from host memory.
  EXPECT_TRUE(Holds(big, 8 * kMiB, 1));
  EXPECT_TRUE(Holds(small, 1000, 2));
  EXPECT_TRUE(Holds(other, 4 * kMiB, 3));
  EXPECT_EQ(*shim.pause().Pause(TagSelection::Only("kv"), true), 0u);  // paused already: 0

  absl::StatusOr<size_t> restored = shim.pause().Resume(TagSelection::Only("kv"));
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, *released);
  EXPECT_TRUE(Holds(big, 8 * kMiB, 1));
  EXPECT_TRUE(Holds(small, 1000, 2));
  EXPECT_EQ(*shim.pause().Resume(TagSelection::Only("kv")), 0u);  // resumed already: 0
  for (CUdeviceptr p : {big, small, other}) {
    ASSERT_TRUE(a.FreeAsync(p, stream_, false).ok());
  }
  Teardown(shim);
}

TEST_F(PauseSelectionTest, FreedStreamOrderedBlocksOfAPausedTagAreReleasedNotKept) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  // A release threshold that keeps every freed block (as PyTorch sets it).
  const cuuint64_t keep_all = UINT64_MAX;
  shim.stream_ordered().PoolAttributeSet(shim.stream_ordered().DefaultPool(0),
                                      CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all);
  const CUdeviceptr kept = AllocAsync(shim, 6 * kMiB, "kv");
  const CUdeviceptr freed = AllocAsync(shim, 16 * kMiB, "kv");
  sim::HoldStream(stream_);
  ASSERT_TRUE(a.FreeAsync(freed, stream_, false).ok());  // waits in the cache, not ready
  EXPECT_GT(shim.control().GetStats().stream_ordered_cached_bytes, 0u);
  const size_t free_before = FreeMemory();
  absl::StatusOr<size_t> released = shim.pause().Pause(TagSelection::Only("kv"), false);
  ASSERT_TRUE(released.ok()) << released.status();
  // Both the live block and the freed one went back to the driver.
  EXPECT_GE(*released, 6 * kMiB + 16 * kMiB);
  EXPECT_EQ(FreeMemory(), free_before + *released);
  EXPECT_EQ(shim.control().GetStats().stream_ordered_cached_bytes, 0u);
  // A new allocation of the freed block's size is new memory, mapped.
  const CUdeviceptr again = AllocAsync(shim, 16 * kMiB, "kv");
  EXPECT_TRUE(Readable(again));
  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Readable(kept));
  ASSERT_TRUE(a.FreeAsync(kept, stream_, false).ok());
  ASSERT_TRUE(a.FreeAsync(again, stream_, false).ok());
  Teardown(shim);
}

TEST_F(PauseSelectionTest, FreeAsyncOfPausedMemoryIsNeverReused) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = AllocAsync(shim, 4 * kMiB, "kv");
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  // Freed while paused: straight back, its backup dropped; a double free is
  // the driver's code, as ever.
  ASSERT_TRUE(a.FreeAsync(p, stream_, false).ok());
  EXPECT_EQ(ToCuResult(a.FreeAsync(p, stream_, false)), CUDA_ERROR_INVALID_VALUE);
  // The same size on the same stream gets mapped memory, not the paused block.
  const CUdeviceptr q = AllocAsync(shim, 4 * kMiB, "kv");
  EXPECT_TRUE(Readable(q));
  Fill(q, 4 * kMiB, 5);
  EXPECT_EQ(*shim.pause().Resume(TagSelection::Only("kv")), 0u);  // nothing paused is left
  EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u);
  ASSERT_TRUE(a.FreeAsync(q, stream_, false).ok());
  Teardown(shim);
}

TEST_F(PauseSelectionTest, AllExceptKeepsTheListedTagsAndTakesEverythingElse) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr weights = Alloc(a, 8 * kMiB, "weights");
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  const CUdeviceptr untagged = Alloc(a, 4 * kMiB, "");
  const CUdeviceptr async_kv = AllocAsync(shim, 2 * kMiB, "kv");
  MakeCurrent(1);
  const CUdeviceptr other_device = Alloc(a, 4 * kMiB, "graph");
  MakeCurrent(0);
  Fill(weights, 8 * kMiB, 1);
  Fill(kv, 8 * kMiB, 2);

  absl::StatusOr<size_t> released =
      shim.pause().Pause(TagSelection::AllExcept({"weights", ""}), true);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(*released, 8 * kMiB + 2 * kMiB + 4 * kMiB);
  EXPECT_TRUE(Holds(weights, 8 * kMiB, 1));
  EXPECT_TRUE(Readable(untagged));
  EXPECT_EQ(shim.control().GetStats().paused_bytes, *released);  // paused, yet addressable:
  EXPECT_TRUE(Holds(kv, 8 * kMiB, 2));
  EXPECT_TRUE(Readable(async_kv));
  char c;
  EXPECT_EQ(sim::DeviceRead(1, &c, other_device, 1), CUDA_SUCCESS);
  // Again: everything selected is paused already.
  EXPECT_EQ(*shim.pause().Pause(TagSelection::AllExcept({"weights", ""}), true), 0u);
  // An empty list is everything.
  EXPECT_TRUE(TagSelection::AllExcept({}).Matches(""));
  EXPECT_TRUE(TagSelection::AllExcept({}).Matches("weights"));
  EXPECT_FALSE(TagSelection::AllExcept({"w", ""}).Matches(""));
  EXPECT_EQ(TagSelection::AllExcept({"w", ""}).Describe(),
            "every allocation but tags 'w', ''");

  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  EXPECT_TRUE(Holds(kv, 8 * kMiB, 2));
  EXPECT_EQ(sim::DeviceRead(1, &c, other_device, 1), CUDA_SUCCESS);
  for (CUdeviceptr p : {weights, kv, untagged}) ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(a.FreeAsync(async_kv, stream_, false).ok());
  MakeCurrent(1);
  ASSERT_TRUE(a.Free(other_device).ok());
  MakeCurrent(0);
  Teardown(shim);
}

TEST_F(PauseSelectionTest, ResidencySaysWhatIsLeftByTagAndKind) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr weights = Alloc(a, 8 * kMiB, "weights");
  const CUdeviceptr kv = Alloc(a, 16 * kMiB, "kv");
  const CUdeviceptr cached = Alloc(a, 4 * kMiB, "");
  ASSERT_TRUE(a.Free(cached).ok());  // kept mapped in the cache
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), false).ok());

  const nlohmann::json doc = nlohmann::json::parse(ResidencyJson(shim.control(), &api_));
  ASSERT_EQ(doc["devices"].size(), 1u);
  const nlohmann::json& d = doc["devices"][0];
  EXPECT_EQ(d["device"], 0);
  EXPECT_EQ(d["shim"]["by_tag"]["weights"]["resident_bytes"], 8 * kMiB);
  EXPECT_EQ(d["shim"]["by_tag"]["kv"]["resident_bytes"], 0u);
  EXPECT_EQ(d["shim"]["by_tag"]["kv"]["paused_bytes"], 16 * kMiB);
  EXPECT_EQ(d["shim"]["cached_bytes"], 4 * kMiB);
  EXPECT_EQ(d["shim"]["resident_bytes"], 12 * kMiB);
  // The driver's figures, in the active primary context: used memory is the
  // shim's resident memory here (the simulated driver has no context
  // overhead), and nothing is left unattributed.
  size_t free = 0, total = 0;
  ASSERT_EQ(sim::cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(d["device_total_bytes"], total);
  EXPECT_EQ(d["device_used_bytes"], total - free);
  EXPECT_EQ(d["unattributed_bytes"], 0u);
  // Without the driver (the exit report): the shim's figures alone.
  const nlohmann::json quiet = nlohmann::json::parse(ResidencyJson(shim.control(), nullptr));
  EXPECT_TRUE(quiet["devices"][0]["device_used_bytes"].is_null());
  EXPECT_EQ(quiet["devices"][0]["shim"]["resident_bytes"], 12 * kMiB);
  EXPECT_EQ(ResidencySummary(shim.control()),
            "resident: device 0: 12582912 bytes (tag 'kv' 0 (paused 16777216), "
            "tag 'weights' 8388608, cache 4194304; passed through 0; "
            "other libraries' VMM 0)");

  ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
  for (CUdeviceptr p : {weights, kv}) ASSERT_TRUE(a.Free(p).ok());
  Teardown(shim);
}

TEST_F(PauseSelectionTest, PassedThroughAllocationsAreCountedUntilFreed) {
  CallCounters c;
  c.PassThroughLive(0x1000, 4096, 0);
  c.PassThroughLive(0x9000, 512, 1);
  EXPECT_EQ(c.PassedThroughLive(0), 4096u);
  EXPECT_EQ(c.PassedThroughLive(1), 512u);
  c.PassThroughFreed(0x1000);
  c.PassThroughFreed(0x5555);  // not passed through: nothing
  EXPECT_EQ(c.PassedThroughLive(0), 0u);
  EXPECT_EQ(c.PassedThroughLive(1), 512u);
}

// Every driver call a stream-ordered pause adds (the synchronize of the
// streams holding freed blocks, then the same steps as any pause) failing
// once: nothing leaked, nothing half paused, and a later resume restores
// the contents.
TEST_F(PauseSelectionTest, FaultsInAStreamOrderedPauseLeaveAConsistentState) {
  CUdeviceptr live = 0;
  const int runs = RunPauseFaults(
      PauseDriverCalls(), 2, TagSelection::Only("kv"),
      [&](ShimCore& shim) {
        Allocator& a = shim.allocator();
        live = AllocAsync(shim, 6 * kMiB, "kv");
        const CUdeviceptr freed = AllocAsync(shim, 4 * kMiB, "kv");
        Fill(live, 6 * kMiB, 9);
        sim::HoldStream(stream_);  // the freed block's stream still busy at the pause
        ASSERT_TRUE(a.FreeAsync(freed, stream_, false).ok());
      },
      [&](ShimCore& shim, const std::string& what) {
        Allocator& a = shim.allocator();
        EXPECT_TRUE(Holds(live, 6 * kMiB, 9)) << what;
        EXPECT_TRUE(a.FreeAsync(live, stream_, false).ok()) << what;
        EXPECT_EQ(sim::cuCtxSynchronize(), CUDA_SUCCESS);
        shim.stream_ordered().Reclaim(-1);
      });
  EXPECT_EQ(runs, static_cast<int>(PauseDriverCalls().size()) * 2 * 2);
}

}  // namespace
}  // namespace vmmshim

// Pause and resume (PauseCoordinator, core/heap/pause.h) while other threads
// call the allocator: allocations of other tags go on, and memory freed
// while its pause is under way goes only after its copy, on the simulated
// driver.
#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/driver/cu_status.h"
#include "core/shim_core.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class PauseConcurrentCallsTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2, 256 * kMiB);
    MakeCurrent(0);
  }
  static CUdeviceptr Alloc(Allocator& a, size_t bytes, const std::string& tag) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes, tag);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }
  // Device 0's blocks (a large one and a packed granule, the small one's
  // tagged `small_tag`) and device 1's, tagged "kv"; device 1's filled with
  // kOtherByte.
  struct KvOnTwoDevices {
    CUdeviceptr large = 0, small = 0, other = 0;
  };
  KvOnTwoDevices AllocKv(Allocator& a, const std::string& small_tag = "kv") {
    KvOnTwoDevices kv;
    kv.large = Alloc(a, 4 * kMiB, "kv");
    kv.small = Alloc(a, 4096, small_tag);
    MakeCurrent(1);
    kv.other = Alloc(a, 4 * kMiB, "kv");
    const std::vector<unsigned char> bytes(4 * kMiB, kOtherByte);
    EXPECT_EQ(sim::DeviceWrite(1, kv.other, bytes.data(), bytes.size()), CUDA_SUCCESS);
    MakeCurrent(0);
    return kv;
  }
  // Pauses `selection` with contents on another thread, holding it at
  // device 1's copy (the third: device 0's two come first; into host VMM
  // memory, a device-to-device copy) so that device 0's blocks are marked
  // and their copies started; then frees device 0's two allocations (and,
  // with `trim`, trims device 0), which must succeed at once and unmap
  // nothing.
  void FreeDeviceZerosWhileThePauseIsUnderWay(ShimCore& shim, const KvOnTwoDevices& kv,
                                              absl::StatusOr<size_t>* paused,
                                              const TagSelection& selection, bool trim = false) {
    Allocator& a = shim.allocator();
    sim::ResetCallCounts();
    sim::HoldCalls("cuMemcpyDtoDAsync_v2", 3);
    std::thread pause([&] { *paused = shim.pause().Pause(selection, true); });
    ASSERT_TRUE(sim::WaitForHeldCall(10000));
    EXPECT_EQ(sim::CallCount("cuMemcpyDtoDAsync_v2"), 2u);
    EXPECT_TRUE(a.Free(kv.large).ok());
    EXPECT_TRUE(a.Free(kv.small).ok());
    if (trim) shim.control().Trim(0);
    EXPECT_EQ(sim::CallCount("cuMemUnmap"), 0u);  // a copy may be reading it
    EXPECT_FALSE(a.Find(kv.large).ok());
    EXPECT_FALSE(a.Find(kv.small).ok());
    EXPECT_EQ(ToCuResult(a.Free(kv.large)), CUDA_ERROR_INVALID_VALUE);  // a double free
    sim::ReleaseHeldCalls();  // (statistics would wait for device 1's arena, held)
    pause.join();
    EXPECT_EQ(shim.control().GetStats().live_allocations, 1u);
  }
  // Whether device 1's block holds kOtherByte throughout.
  static bool OtherHoldsItsBytes(CUdeviceptr other) {
    std::vector<unsigned char> back(4 * kMiB);
    return sim::DeviceRead(1, back.data(), other, back.size()) == CUDA_SUCCESS &&
           std::all_of(back.begin(), back.end(), [](unsigned char c) { return c == kOtherByte; });
  }
  static constexpr unsigned char kOtherByte = 0x5a;
};

// Pauses and resumes of one tag while other threads allocate, write, read
// and free memory of other tags.
TEST_F(PauseConcurrentCallsTest, PauseAndResumeConcurrentWithAllocationsElsewhere) {
  AllocatorOptions options;
  options.arenas = 4;
  ShimCore shim(api_, options);
  Allocator& a = shim.allocator();
  const CUdeviceptr kv = Alloc(a, 8 * kMiB, "kv");
  Fill(kv, 8 * kMiB, 13);
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 3; ++t) {
    workers.emplace_back([&, t] {
      MakeCurrent(0);
      std::mt19937 rng(t);
      while (!stop.load()) {
        const size_t bytes = 256 + rng() % (3 * kMiB);
        absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes, "w" + std::to_string(t));
        if (!r.ok()) continue;
        const unsigned char v = static_cast<unsigned char>(t + 1);
        if (sim::DeviceWrite(0, r->ptr, &v, 1) != CUDA_SUCCESS) ++bad;
        unsigned char back = 0;
        if (sim::DeviceRead(0, &back, r->ptr, 1) != CUDA_SUCCESS || back != v) ++bad;
        if (!a.Free(r->ptr).ok()) ++bad;
      }
    });
  }
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    ASSERT_TRUE(Holds(kv, 8 * kMiB, 13)) << i;
  }
  stop = true;
  for (std::thread& w : workers) w.join();
  EXPECT_EQ(bad.load(), 0);
  ASSERT_TRUE(a.Free(kv).ok());
}

// Note [A block freed while its pause is under way] (core/heap/
// arena_pause.h): the pause releases the freed blocks after their copies
// and counts them; device 1's block is paused and resumes whole.
TEST_F(PauseConcurrentCallsTest, MemoryFreedWhileItsPauseIsUnderWayGoesAfterItsCopy) {
  {
    ShimCore shim(api_);
    Allocator& a = shim.allocator();
    const KvOnTwoDevices kv = AllocKv(a);
    absl::StatusOr<size_t> paused;
    FreeDeviceZerosWhileThePauseIsUnderWay(shim, kv, &paused, TagSelection::Only("kv"));
    ASSERT_TRUE(paused.ok()) << paused.status();
    EXPECT_EQ(*paused, 10 * kMiB);  // device 0's 4 MiB and 2 MiB granule, device 1's 4 MiB
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    EXPECT_EQ(shim.control().GetStats().paused_bytes, 4 * kMiB);
    absl::StatusOr<size_t> restored = shim.pause().Resume(TagSelection::Only("kv"));
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(*restored, 4 * kMiB);
    EXPECT_TRUE(OtherHoldsItsBytes(kv.other));
    ASSERT_TRUE(a.Free(kv.other).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// The same frees, then device 1's copy fails: nothing is paused, and the
// freed memory goes at the abort.
TEST_F(PauseConcurrentCallsTest, MemoryFreedWhileAFailingPauseIsUnderWayGoesAtTheAbort) {
  {
    ShimCore shim(api_);
    Allocator& a = shim.allocator();
    const KvOnTwoDevices kv = AllocKv(a);
    sim::FailCall("cuMemcpyDtoDAsync_v2", 3, CUDA_ERROR_UNKNOWN);
    absl::StatusOr<size_t> paused;
    FreeDeviceZerosWhileThePauseIsUnderWay(shim, kv, &paused, TagSelection::Only("kv"));
    sim::ClearFailures();
    EXPECT_EQ(ToCuResult(paused.status()), CUDA_ERROR_UNKNOWN);
    EXPECT_EQ(sim::GetUsage().handles, 1u);  // device 1's, live
    EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u);
    EXPECT_TRUE(OtherHoldsItsBytes(kv.other));
    ASSERT_TRUE(a.Free(kv.other).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

// An untagged granule with explicit peer access is sealed, and a trim
// releases sealed granules that empty: not one whose pause is under way,
// whose copy may still be reading it.
TEST_F(PauseConcurrentCallsTest, ATrimLeavesAGranuleFreedWhileItsPauseIsUnderWay) {
  {
    ShimCore shim(api_);
    Allocator& a = shim.allocator();
    const KvOnTwoDevices kv = AllocKv(a, /*small_tag=*/"");
    ASSERT_TRUE(shim.peers().SetPeerAccess(kv.small, 1, /*grant=*/true).ok());  // seals it
    absl::StatusOr<size_t> paused;
    FreeDeviceZerosWhileThePauseIsUnderWay(shim, kv, &paused, TagSelection::All(), /*trim=*/true);
    ASSERT_TRUE(paused.ok()) << paused.status();
    EXPECT_EQ(*paused, 10 * kMiB);
    EXPECT_EQ(sim::GetUsage().handles, 0u);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::All()).ok());
    EXPECT_TRUE(OtherHoldsItsBytes(kv.other));
    ASSERT_TRUE(a.Free(kv.other).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
  ExpectNothingLeft();
}

}  // namespace
}  // namespace vmmshim

// What stays consistent when a capture ends in the middle of a free, or a
// driver call fails in the middle of a multi-step operation (reconcile after a
// peer enable, release of a context, unmap of an empty granule, release of a
// large block); and the clamp of a packing threshold above the granularity.
// Each of these failed on an earlier version.
#include <atomic>
#include <chrono>
#include <thread>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
const CUstream kStream = reinterpret_cast<CUstream>(0x51);

class FailureRecoveryTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim();
    ctx_ = MakeCurrent(0);
  }
  void TearDown() override {
    sim::ReleaseHeldCalls();
    sim::ClearFailures();
  }
  CUcontext ctx_ = nullptr;
};

// 1. A free that passed captures_.any() before the last capture ended, and
// defers after CaptureEnded's ReclaimDeferred looked at the deferred count,
// is never completed by the end of the capture (stranded).
TEST_F(FailureRecoveryTest, FreeRacingTheLastCaptureEndIsReclaimed) {
  AllocatorOptions no_cache;
  no_cache.cache_limit_percent = -1;
  ShimCore shim(api_, no_cache);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 8 * kMiB);
  ASSERT_EQ(shim.captures().BeginCapture(kStream, false, [&] {
    return sim::cuStreamBeginCapture_v2(kStream, CU_STREAM_CAPTURE_MODE_RELAXED);
  }), CUDA_SUCCESS);
  sim::HoldCalls("cuMemFree_v2");  // the probe FreeGated makes after any()
  std::thread t([&] {
    sim::cuCtxSetCurrent(ctx_);
    EXPECT_TRUE(a.Free(p).ok());
  });
  ASSERT_TRUE(sim::WaitForHeldCall(10000));
  CUgraph g = nullptr;
  ASSERT_EQ(sim::cuStreamEndCapture(kStream, &g), CUDA_SUCCESS);
  // The last capture ends while the free is between its check and its
  // deferral: the end waits for the free (the gate), then reclaims it.
  std::thread ender([&] { a.CaptureEnded(kStream, false); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  sim::ReleaseHeldCalls();
  t.join();
  ender.join();
  EXPECT_FALSE(shim.captures().any());
  // No capture in progress, yet the free is held back and the memory mapped.
  EXPECT_EQ(shim.control().GetStats().deferred_frees, 0u);
  EXPECT_EQ(sim::DeviceBytesInUse(0), 0u);
}

// 2. A capture begun through a _ptsz entry point on an ordinary stream and
// ended through the plain one (same stream, legal) is never forgotten:
// every later free is deferred.
TEST_F(FailureRecoveryTest, CaptureEndedThroughTheOtherEntryPointIsForgotten) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  ASSERT_EQ(shim.captures().BeginCapture(kStream, /*per_thread=*/true, [&] {
    return sim::cuStreamBeginCapture_v2_ptsz(kStream, CU_STREAM_CAPTURE_MODE_RELAXED);
  }), CUDA_SUCCESS);
  CUgraph g = nullptr;
  ASSERT_EQ(sim::cuStreamEndCapture(kStream, &g), CUDA_SUCCESS);
  a.CaptureEnded(kStream, /*per_thread=*/false);
  EXPECT_FALSE(shim.captures().any());
  const CUdeviceptr p = MustAllocate(a, 4096);
  EXPECT_TRUE(a.Free(p).ok());
  EXPECT_EQ(shim.control().GetStats().deferred_frees, 0u);
}

// 3. CreateBlockLocked: a peer enabled while cuMemMap runs unlocked, then
// the reconciling cuMemSetAccess fails: DestroyBlockLocked ->
// ForgetBlockLocked decrements live_allocations for a large block that was
// never counted.
TEST_F(FailureRecoveryTest, FailedReconcileAfterPeerEnableKeepsLiveAllocations) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  ASSERT_TRUE(a.Allocate(256).ok());  // heap exists
  sim::HoldCalls("cuMemMap");
  std::atomic<bool> done{false};
  absl::Status st;
  std::thread t([&] {
    sim::cuCtxSetCurrent(ctx_);
    st = a.Allocate(4 * kMiB).status();
    done = true;
  });
  ASSERT_TRUE(sim::WaitForHeldCall(10000));
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());  // grants the existing granule
  // MapWithAccess's cuMemSetAccess succeeds; ApplyAccessLocked's fails.
  sim::FailCall("cuMemSetAccess", 2, CUDA_ERROR_UNKNOWN);
  sim::ReleaseHeldCalls();
  t.join();
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(shim.control().GetStats().live_allocations, 1u);  // the 256-byte one
  EXPECT_EQ(shim.control().GetStats().live_bytes, 256u);
}

// 4. ReleaseContext with a failed cuMemUnmap forgets a block that is still
// mapped and returns its VA to the arena; the next block gets that VA and
// cuMemMap fails (and the handle is leaked, uncounted).
TEST_F(FailureRecoveryTest, ReleaseContextWithFailedUnmapDoesNotReuseTheVa) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  MustAllocate(a, 8 * kMiB);
  sim::FailCall("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  a.ReleaseContext(ctx_, true);
  absl::StatusOr<Allocator::Allocation> r = a.Allocate(8 * kMiB);
  EXPECT_TRUE(r.ok()) << r.status();
  r = a.Allocate(8 * kMiB);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(shim.control().GetStats().handles, sim::GetUsage().handles);
}

// 5. packing_threshold above the granularity: AllocateSlow dereferences an
// empty optional (Slab::Allocate of more than a granule).
TEST_F(FailureRecoveryTest, PackingThresholdAboveGranularityIsClamped) {
  AllocatorOptions o;
  o.packing_threshold = 8 * kMiB;
  ShimCore shim(api_, o);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 4 * kMiB);
  absl::StatusOr<PointerInfo> info = a.Find(p);
  ASSERT_TRUE(info.ok());
  EXPECT_GE(info->allocation_size, 4 * kMiB);
  EXPECT_GE(info->range_size, 4 * kMiB);
}

}  // namespace
}  // namespace vmmshim

namespace vmmshim {
namespace {

// 6. A sealed granule (explicit grant) whose last free cannot unmap it is
// in no bin: Trim never retries it, it stays mapped and held until ReleaseAll.
TEST_F(FailureRecoveryTest, SealedEmptyGranuleThatFailedToUnmapIsRetriedByTrim) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 256);
  ASSERT_TRUE(shim.peers().SetPeerAccess(p, 1, true).ok());  // seals the granule
  sim::FailCall("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_TRUE(a.Free(p).ok());
  shim.control().Trim();
  EXPECT_EQ(sim::GetUsage().handles, 0u);
  EXPECT_EQ(shim.control().GetStats().handles, 0u);
}

// 7. A large free whose cuMemRelease fails: the mapping is gone, so the free
// succeeded (a second one is INVALID_VALUE); the handle stays counted until
// Trim releases it. (Before the fix the first free reported an error.)
TEST_F(FailureRecoveryTest, LargeFreeWithFailedReleaseSucceedsAndKeepsTheHandleCounted) {
  AllocatorOptions no_cache;
  no_cache.cache_limit_percent = -1;
  ShimCore shim(api_, no_cache);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 8 * kMiB);
  sim::FailCall("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
  absl::Status first = a.Free(p);
  absl::Status second = a.Free(p);
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_EQ(ToCuResult(second), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(shim.control().GetStats().handles, 1u);
  EXPECT_EQ(sim::GetUsage().handles, 1u);
  shim.control().Trim();  // retries the release
  EXPECT_EQ(shim.control().GetStats().handles, 0u);
  EXPECT_EQ(sim::GetUsage().handles, 0u);
}

}  // namespace
}  // namespace vmmshim

// Stream capture, as the driver does it (core/sync/capture.h; codes measured on
// H200 with examples/parity_probe.cu): what Allocate, Free and FreeAsync
// return during captures of each mode, what becomes of the capture, and that
// memory freed while a capture prevents synchronizing is neither reused nor
// unmapped before a later synchronize; and that the shim's own threads never
// invalidate a capture.
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

class CaptureTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim();
    ctx_ = MakeCurrent(0);
  }
  // What the hooks do around the driver's begin and end.
  void Begin(ShimCore& shim, CUstreamCaptureMode mode) {
    ASSERT_EQ(shim.captures().BeginCapture(kStream, false,
                                        [&] { return sim::cuStreamBeginCapture_v2(kStream, mode); }),
              CUDA_SUCCESS);
  }
  CUresult End(Allocator& a) {
    CUgraph graph = nullptr;
    CUresult r = sim::cuStreamEndCapture(kStream, &graph);
    a.CaptureEnded(kStream, false);
    return r;
  }
  static CUstreamCaptureStatus Status() {
    CUstreamCaptureStatus s = CU_STREAM_CAPTURE_STATUS_NONE;
    EXPECT_EQ(sim::cuStreamIsCapturing(kStream, &s), CUDA_SUCCESS);
    return s;
  }
  CUcontext ctx_ = nullptr;
};

TEST_F(CaptureTest, GlobalModeRefusesAllocateAndFreeAndInvalidatesTheCapture) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 8 * kMiB);
  Begin(shim, CU_STREAM_CAPTURE_MODE_GLOBAL);
  EXPECT_EQ(ToCuResult(a.Allocate(256).status()), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(Status(), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  EXPECT_EQ(ToCuResult(a.Free(p)), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_TRUE(a.Find(p).ok());  // a refused free leaves the allocation live
  EXPECT_EQ(End(a), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_FALSE(shim.captures().any());
  EXPECT_TRUE(a.Free(p).ok());
}

TEST_F(CaptureTest, GlobalModeRefusesAnotherThreadToo) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Begin(shim, CU_STREAM_CAPTURE_MODE_GLOBAL);
  std::thread t([&] {
    ASSERT_EQ(sim::cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    EXPECT_EQ(ToCuResult(a.Allocate(256).status()), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  });
  t.join();
  EXPECT_EQ(End(a), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

TEST_F(CaptureTest, ThreadLocalModeRefusesOnlyTheCapturingThread) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  Begin(shim, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  std::thread t([&] {
    ASSERT_EQ(sim::cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(4 * kMiB);
    ASSERT_TRUE(r.ok() && r->served);
    EXPECT_TRUE(a.Free(r->ptr).ok());  // deferred, not synchronized
  });
  t.join();
  EXPECT_EQ(Status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(ToCuResult(a.Allocate(256).status()), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(End(a), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

TEST_F(CaptureTest, RelaxedModeFreeIsDeferredUntilALaterSynchronize) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr big = MustAllocate(a, 8 * kMiB);
  const CUdeviceptr small = MustAllocate(a, 4096);
  Begin(shim, CU_STREAM_CAPTURE_MODE_RELAXED);
  sim::ResetCallCounts();
  EXPECT_TRUE(a.Free(big).ok());
  EXPECT_TRUE(a.Free(small).ok());
  EXPECT_EQ(sim::CallCount("cuCtxSynchronize_v2"), 0u);  // it would break the capture
  EXPECT_EQ(sim::CallCount("cuMemUnmap"), 0u);
  EXPECT_EQ(Status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_FALSE(a.Find(big).ok());                         // gone for the application
  EXPECT_EQ(ToCuResult(a.Free(big)), CUDA_ERROR_INVALID_VALUE);  // a second free
  EXPECT_EQ(shim.control().GetStats().deferred_frees, 2u);
  // Held back: new allocations of the same sizes get other memory.
  const CUdeviceptr big2 = MustAllocate(a, 8 * kMiB);
  const CUdeviceptr small2 = MustAllocate(a, 4096);
  EXPECT_NE(big2, big);
  EXPECT_NE(small2, small);
  EXPECT_EQ(Status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(End(a), CUDA_SUCCESS);
  // The next free synchronizes the context: the deferred frees complete.
  EXPECT_TRUE(a.Free(small2).ok());
  EXPECT_EQ(shim.control().GetStats().deferred_frees, 0u);
  EXPECT_EQ(MustAllocate(a, 8 * kMiB), big);  // from the cache now
  EXPECT_TRUE(a.Free(big).ok());
  EXPECT_TRUE(a.Free(big2).ok());
}

TEST_F(CaptureTest, TrimCompletesDeferredFreesOnceTheCaptureEnded) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 8 * kMiB);
  Begin(shim, CU_STREAM_CAPTURE_MODE_RELAXED);
  EXPECT_TRUE(a.Free(p).ok());
  EXPECT_EQ(shim.control().Trim(), 0u);  // still capturing: nothing can be synchronized
  EXPECT_EQ(shim.control().GetStats().live_allocations, 1u);
  EXPECT_EQ(End(a), CUDA_SUCCESS);
  EXPECT_EQ(shim.control().Trim(), 8 * kMiB);
  EXPECT_EQ(shim.control().GetStats().live_allocations, 0u);
  EXPECT_EQ(sim::DeviceBytesInUse(0), 0u);
}

TEST_F(CaptureTest, OutOfMemoryReclaimsDeferredFreesOnceTheCaptureEnded) {
  StartSim(1, 64 * kMiB);
  MakeCurrent(0);
  AllocatorOptions no_cache;
  no_cache.cache_limit_percent = -1;
  ShimCore shim(api_, no_cache);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 48 * kMiB);
  Begin(shim, CU_STREAM_CAPTURE_MODE_RELAXED);
  EXPECT_TRUE(a.Free(p).ok());
  EXPECT_EQ(ToCuResult(a.Allocate(48 * kMiB).status()), CUDA_ERROR_OUT_OF_MEMORY);  // held back
  EXPECT_EQ(End(a), CUDA_SUCCESS);
  const CUdeviceptr q = MustAllocate(a, 48 * kMiB);  // the deferred free completes first
  EXPECT_NE(q, 0u);
  EXPECT_EQ(shim.control().GetStats().deferred_frees, 0u);
  EXPECT_TRUE(a.Free(q).ok());
}

TEST_F(CaptureTest, FreeAsyncOnTheCapturingStreamIsInvalidValueAndTheCaptureGoesOn) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 256);
  for (CUstreamCaptureMode mode : {CU_STREAM_CAPTURE_MODE_GLOBAL,
                                   CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                   CU_STREAM_CAPTURE_MODE_RELAXED}) {
    Begin(shim, mode);
    EXPECT_EQ(ToCuResult(a.FreeAsync(p, kStream, false)), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(Status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    EXPECT_EQ(End(a), CUDA_SUCCESS);
  }
  EXPECT_TRUE(a.FreeAsync(p, nullptr, false).ok());
}

TEST_F(CaptureTest, FreeAsyncOnAnotherStreamFollowsTheUnsafeCallRule) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const CUdeviceptr p = MustAllocate(a, 256);
  const CUstream other = reinterpret_cast<CUstream>(0x52);
  Begin(shim, CU_STREAM_CAPTURE_MODE_GLOBAL);
  EXPECT_EQ(ToCuResult(a.FreeAsync(p, other, false)), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(End(a), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  Begin(shim, CU_STREAM_CAPTURE_MODE_RELAXED);
  EXPECT_TRUE(a.FreeAsync(p, other, false).ok());
  EXPECT_EQ(Status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(End(a), CUDA_SUCCESS);
}

TEST_F(CaptureTest, NoCaptureMeansNoProbe) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  sim::ResetCallCounts();
  const CUdeviceptr p = MustAllocate(a, 256);
  EXPECT_TRUE(a.Free(p).ok());
  EXPECT_EQ(sim::CallCount("cuMemFree_v2"), 0u);
}

// Note [The shim's own threads and captures] (core/sync/capture.h): with
// VMM calls counted as unsafe during a capture, the first pause's host
// memory is made in the background, and the contents move there and map
// (Note [Views made late]), while the program holds a global-mode capture
// open: the capture stays valid and the contents become addressable.
TEST_F(CaptureTest, TheShimsOwnThreadsLeaveAGlobalCaptureValid) {
  sim::SimOptions o;
  o.vmm_calls_unsafe_during_capture = true;
  sim::Reset(o);
  ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
  api_ = sim::Api();
  MakeCurrent(0);
  AllocatorOptions options;
  options.host_memory_in_background = true;
  {
    ShimCore shim(api_, options);
    Allocator& a = shim.allocator();
    absl::StatusOr<Allocator::Allocation> kv = a.Allocate(8 * kMiB, "kv");
    ASSERT_TRUE(kv.ok() && kv->served) << kv.status();
    Fill(kv->ptr, 8 * kMiB, 4);
    sim::HoldCalls("cuMemCreate");  // the maker's, until the capture is open
    ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
    ASSERT_TRUE(sim::WaitForHeldCall(5000));
    Begin(shim, CU_STREAM_CAPTURE_MODE_GLOBAL);
    sim::ReleaseHeldCalls();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    char c;
    while (sim::DeviceRead(0, &c, kv->ptr, 1) != CUDA_SUCCESS &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(Holds(kv->ptr, 8 * kMiB, 4));  // through the view made late
    EXPECT_EQ(Status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    EXPECT_EQ(End(a), CUDA_SUCCESS);
    ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
    EXPECT_TRUE(Holds(kv->ptr, 8 * kMiB, 4));
    ASSERT_TRUE(a.Free(kv->ptr).ok());
    ASSERT_TRUE(shim.ReleaseAll().ok());
  }
}

}  // namespace
}  // namespace vmmshim

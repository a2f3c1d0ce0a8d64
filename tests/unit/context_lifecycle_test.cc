// core/lifecycle/context_lifecycle.h on the simulated driver: what happens to shim
// memory around cuDevicePrimaryCtxReset, cuDevicePrimaryCtxRelease and
// cuCtxDestroy.
#include "core/lifecycle/context_lifecycle.h"

#include <memory>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// What the driver's state was when the "real" function was called.
struct AtRealCall {
  int calls = 0;
  uint64_t syncs = 0;       // sim::SyncCount(device)
  size_t device_bytes = 0;  // sim::DeviceBytesInUse(device)
};
AtRealCall g_at_real;

// The simulated cuDevicePrimaryCtxReset_v2, recording the state first.
CUresult RecordingReset(CUdevice device) {
  ++g_at_real.calls;
  g_at_real.syncs = sim::SyncCount(device);
  g_at_real.device_bytes = sim::DeviceBytesInUse(device);
  return sim::cuDevicePrimaryCtxReset_v2(device);
}

// A release at process exit: the driver is torn down already.
CUresult DeinitializedRelease(CUdevice) { return CUDA_ERROR_DEINITIALIZED; }

class ContextLifecycleTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim();
    core_ = std::make_unique<ShimCore>(api_);
    g_at_real = {};
  }
  // Retains the primary context of `device` and makes it current.
  CUcontext RetainPrimary(int device) { return MakeCurrent(device); }
  CUdeviceptr Alloc(size_t bytes) { return MustAllocate(core_->allocator(), bytes); }
  bool Live(CUdeviceptr p) const { return core_->allocator().Find(p).ok(); }
  ContextLifecycle Lifecycle() const { return ContextLifecycle(api_, core_->allocator(), nullptr); }
  static bool PrimaryActive(int device) {
    unsigned int flags = 0;
    int active = -1;
    EXPECT_EQ(sim::cuDevicePrimaryCtxGetState(device, &flags, &active), CUDA_SUCCESS);
    return active != 0;
  }

  std::unique_ptr<ShimCore> core_;
};

TEST_F(ContextLifecycleTest, ActivePrimaryContextKeepsTheReferenceCount) {
  EXPECT_EQ(ActivePrimaryContext(api_, 0), nullptr);  // inactive: nothing retained
  EXPECT_FALSE(PrimaryActive(0));
  CUcontext ctx = RetainPrimary(0);
  EXPECT_EQ(ActivePrimaryContext(api_, 0), ctx);
  // Still exactly one reference: one release makes it inactive.
  ASSERT_EQ(sim::cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  EXPECT_FALSE(PrimaryActive(0));
  EXPECT_EQ(ActivePrimaryContext(api_, 7), nullptr);  // invalid device
  DriverApi without_state = api_;
  without_state.cuDevicePrimaryCtxGetState = nullptr;
  RetainPrimary(0);
  EXPECT_EQ(ActivePrimaryContext(without_state, 0), nullptr);
}

TEST_F(ContextLifecycleTest, ResetReleasesThePrimaryContextsMemorySynchronizedFirst) {
  RetainPrimary(0);
  const size_t baseline = sim::DeviceBytesInUse(0);
  CUdeviceptr large = Alloc(8 * kMiB);
  CUdeviceptr small = Alloc(4096);
  ASSERT_GT(sim::DeviceBytesInUse(0), baseline);
  const uint64_t syncs = sim::SyncCount(0);
  EXPECT_EQ(Lifecycle().PrimaryCtxReset(&RecordingReset, 0), CUDA_SUCCESS);
  // By the time the driver resets, the context was synchronized and the
  // shim's memory of it is back.
  EXPECT_EQ(g_at_real.calls, 1);
  EXPECT_EQ(g_at_real.syncs, syncs + 1);
  EXPECT_EQ(g_at_real.device_bytes, baseline);
  EXPECT_FALSE(Live(large));
  EXPECT_FALSE(Live(small));
  EXPECT_EQ(ToCuResult(core_->allocator().Free(small)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_FALSE(PrimaryActive(0));
  // The device works again after the reset.
  RetainPrimary(0);
  CUdeviceptr again = Alloc(8 * kMiB);
  EXPECT_TRUE(core_->allocator().Free(again).ok());
}

TEST_F(ContextLifecycleTest, ResetOfAnInactiveContextOnlyCallsTheDriver) {
  RetainPrimary(1);
  CUdeviceptr other = Alloc(4 * kMiB);  // device 1's: untouched
  sim::ResetCallCounts();
  EXPECT_EQ(Lifecycle().PrimaryCtxReset(&RecordingReset, 0), CUDA_SUCCESS);
  EXPECT_EQ(g_at_real.calls, 1);
  EXPECT_EQ(sim::CallCount("cuDevicePrimaryCtxRetain"), 0u);
  EXPECT_TRUE(Live(other));
  EXPECT_EQ(Lifecycle().PrimaryCtxReset(api_.cuDevicePrimaryCtxReset_v2, 7),
            CUDA_ERROR_INVALID_DEVICE);  // the driver's code, unchanged
  EXPECT_TRUE(core_->allocator().Free(other).ok());
}

TEST_F(ContextLifecycleTest, ReleaseOfANonLastReferenceKeepsTheMemory) {
  RetainPrimary(0);
  RetainPrimary(0);  // two references
  CUdeviceptr p = Alloc(8 * kMiB);
  EXPECT_EQ(Lifecycle().PrimaryCtxRelease(api_.cuDevicePrimaryCtxRelease_v2, 0), CUDA_SUCCESS);
  EXPECT_TRUE(PrimaryActive(0));
  EXPECT_TRUE(Live(p));
  int v = 7;
  EXPECT_EQ(sim::DeviceWrite(0, p, &v, sizeof v), CUDA_SUCCESS);
  EXPECT_TRUE(core_->allocator().Free(p).ok());
}

TEST_F(ContextLifecycleTest, LastReleaseFreesTheMemoryWithoutSynchronizing) {
  RetainPrimary(0);
  const size_t baseline = sim::DeviceBytesInUse(0);
  CUdeviceptr large = Alloc(8 * kMiB);
  CUdeviceptr small = Alloc(4096);
  const uint64_t syncs = sim::SyncCount(0);
  EXPECT_EQ(Lifecycle().PrimaryCtxRelease(api_.cuDevicePrimaryCtxRelease_v2, 0), CUDA_SUCCESS);
  EXPECT_FALSE(PrimaryActive(0));
  EXPECT_EQ(sim::SyncCount(0), syncs);  // the driver waited when it destroyed it
  EXPECT_FALSE(Live(large));
  EXPECT_FALSE(Live(small));
  EXPECT_EQ(sim::DeviceBytesInUse(0), baseline);
}

TEST_F(ContextLifecycleTest, FailedReleaseKeepsTheMemoryAndReturnsTheDriversCode) {
  RetainPrimary(0);
  CUdeviceptr p = Alloc(8 * kMiB);
  EXPECT_EQ(Lifecycle().PrimaryCtxRelease(&DeinitializedRelease, 0), CUDA_ERROR_DEINITIALIZED);
  EXPECT_TRUE(Live(p));
  // A release without a reference: the driver's code, nothing released.
  ASSERT_EQ(sim::cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
  EXPECT_EQ(Lifecycle().PrimaryCtxRelease(api_.cuDevicePrimaryCtxRelease_v2, 0),
            CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(ContextLifecycleTest, DestroyReleasesThatContextsMemoryWithoutSynchronizing) {
  RetainPrimary(1);
  CUdeviceptr keep = Alloc(4 * kMiB);  // primary context of device 1
  CUcontext created;
  ASSERT_EQ(sim::cuCtxCreate_v2(&created, 0, 1), CUDA_SUCCESS);  // now current
  CUdeviceptr gone = Alloc(8 * kMiB);
  CUdeviceptr gone_small = Alloc(4096);
  const uint64_t syncs = sim::SyncCount(1);
  EXPECT_EQ(Lifecycle().CtxDestroy(api_.cuCtxDestroy_v2, created), CUDA_SUCCESS);
  EXPECT_EQ(sim::SyncCount(1), syncs);
  EXPECT_FALSE(Live(gone));
  EXPECT_FALSE(Live(gone_small));
  EXPECT_TRUE(Live(keep));
  EXPECT_TRUE(core_->allocator().Free(keep).ok());
}

TEST_F(ContextLifecycleTest, DestroyForgetsTheContextsDevice) {
  // A new context may reuse a destroyed one's handle, on another device: the
  // allocator must ask for its device again.
  CUcontext first;
  ASSERT_EQ(sim::cuCtxCreate_v2(&first, 0, 1), CUDA_SUCCESS);
  CUdeviceptr p = Alloc(4096);  // the allocator now knows `first` is device 1's
  ASSERT_EQ(core_->allocator().Find(p)->device, 1);
  ASSERT_EQ(Lifecycle().CtxDestroy(api_.cuCtxDestroy_v2, first), CUDA_SUCCESS);
  CUcontext second;
  ASSERT_EQ(sim::cuCtxCreate_v2(&second, 0, 0), CUDA_SUCCESS);
  if (second != first) GTEST_SKIP() << "the simulated driver did not reuse the handle";
  CUdeviceptr q = Alloc(4096);
  ASSERT_TRUE(core_->allocator().Find(q).ok());
  EXPECT_EQ(core_->allocator().Find(q)->device, 0);
  EXPECT_TRUE(core_->allocator().Free(q).ok());
  ASSERT_EQ(sim::cuCtxDestroy_v2(second), CUDA_SUCCESS);
}

TEST_F(ContextLifecycleTest, FailedDestroyReleasesNothing) {
  CUcontext primary = RetainPrimary(0);
  CUdeviceptr p = Alloc(8 * kMiB);
  // The simulated driver destroys only created contexts.
  EXPECT_EQ(Lifecycle().CtxDestroy(api_.cuCtxDestroy_v2, primary), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_TRUE(Live(p));
  EXPECT_TRUE(core_->allocator().Free(p).ok());
}

TEST_F(ContextLifecycleTest, MissingEntryPointIsNotInitializedAndChangesNothing) {
  RetainPrimary(0);
  CUdeviceptr p = Alloc(8 * kMiB);
  sim::ResetCallCounts();
  EXPECT_EQ(Lifecycle().PrimaryCtxReset(nullptr, 0), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(Lifecycle().PrimaryCtxRelease(nullptr, 0), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(Lifecycle().CtxDestroy(nullptr, nullptr), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(sim::CallCount("cuDevicePrimaryCtxGetState"), 0u);
  EXPECT_TRUE(Live(p));
  EXPECT_TRUE(PrimaryActive(0));
}

}  // namespace
}  // namespace vmmshim

// Statistics from one source of truth: the process-wide figures are the sums
// of the devices' figures after every path that removes memory, including
// the failure paths. The first three tests failed on the
// allocator before the split (dce4891): ReleaseAll zeroed the process-wide
// live counters but not each device's, and the paths that forget a block
// without unmapping it (unmap failed, driver gone) did not update every
// handle count.
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

class StatsTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim();
    MakeCurrent(0);
  }
  // The process-wide figures equal the sums of the devices' figures.
  static void ExpectSumsAgree(const ShimCore& shim) {
    uint64_t live_bytes = 0, handle_bytes = 0;
    for (const DeviceStats& d : shim.control().GetStats().devices) {
      live_bytes += d.live_bytes;
      handle_bytes += d.handle_bytes;
    }
    const AllocatorStats s = shim.control().GetStats();
    EXPECT_EQ(s.live_bytes, live_bytes);
    EXPECT_EQ(s.handle_bytes, handle_bytes);
  }
};

TEST_F(StatsTest, ReleaseAllZeroesEveryDevicesLiveFigures) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  MustAllocate(a, 256);
  MustAllocate(a, 8 * kMiB);
  ASSERT_TRUE(shim.ReleaseAll().ok());
  EXPECT_EQ(shim.control().GetStats().live_allocations, 0u);
  EXPECT_EQ(shim.control().GetStats().live_bytes, 0u);
  for (const DeviceStats& d : shim.control().GetStats().devices) {
    EXPECT_EQ(d.live_bytes, 0u) << "device " << d.device;
    EXPECT_EQ(d.handle_bytes, 0u) << "device " << d.device;
  }
  ExpectSumsAgree(shim);
}

TEST_F(StatsTest, ReleaseAllWithAFailedUnmapStillForgetsTheHandle) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  MustAllocate(a, 8 * kMiB);
  sim::FailCall("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_FALSE(shim.ReleaseAll().ok());
  EXPECT_EQ(shim.control().GetStats().handles, 0u);
  EXPECT_EQ(shim.control().GetStats().handle_bytes, 0u);
  for (const DeviceStats& d : shim.control().GetStats().devices) EXPECT_EQ(d.handle_bytes, 0u);
  ExpectSumsAgree(shim);
}

TEST_F(StatsTest, FreeAfterDriverTeardownUpdatesTheDevicesHandleBytes) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr p = MustAllocate(a, 8 * kMiB);
  sim::FailCall("cuCtxSynchronize_v2", 1, CUDA_ERROR_DEINITIALIZED);
  EXPECT_EQ(ToCuResult(a.Free(p)), CUDA_ERROR_DEINITIALIZED);
  for (const DeviceStats& d : shim.control().GetStats().devices) EXPECT_EQ(d.handle_bytes, 0u);
  EXPECT_EQ(shim.control().GetStats().handle_bytes, 0u);
  ExpectSumsAgree(shim);
}

TEST_F(StatsTest, SumsAgreeThroughCacheContextReleaseAndTrim) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  std::vector<CUdeviceptr> ptrs;
  for (size_t bytes : {size_t{256}, size_t{4096}, 3 * kMiB, 64 * kMiB, size_t{100000}}) {
    ptrs.push_back(MustAllocate(a, bytes));
  }
  ExpectSumsAgree(shim);
  ASSERT_TRUE(a.Free(ptrs[2]).ok());  // cached
  ASSERT_TRUE(a.Free(ptrs[0]).ok());
  ExpectSumsAgree(shim);
  EXPECT_EQ(shim.control().GetStats().live_allocations, 3u);
  EXPECT_EQ(shim.control().GetStats().frees, 2u);
  shim.control().Trim();
  ExpectSumsAgree(shim);
  CUcontext ctx = nullptr;
  ASSERT_EQ(sim::cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  EXPECT_GT(a.ReleaseContext(ctx, true), 0u);
  EXPECT_EQ(shim.control().GetStats().live_allocations, 0u);
  EXPECT_EQ(shim.control().GetStats().handles, 0u);
  ExpectSumsAgree(shim);
}

}  // namespace
}  // namespace vmmshim

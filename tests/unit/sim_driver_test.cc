// The simulated driver must enforce the VMM rules the allocator relies on;
// otherwise the allocator tests could pass against a lenient fake.
#include "tests/sim/sim_driver.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace vmmshim {
namespace sim_test {
using namespace ::vmmshim::sim;  // NOLINT
namespace sim = ::vmmshim::sim;
namespace {

constexpr size_t kGran = size_t{2} << 20;

class SimDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SimOptions o;
    o.device_count = 2;
    o.memory_per_device = size_t{64} << 20;
    Reset(o);
    ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
    CUcontext ctx;
    ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = 0;
  }
  // One granule created, reserved and mapped (no access granted yet).
  void MapOneGranule(CUmemGenericAllocationHandle* h, CUdeviceptr* va) {
    ASSERT_EQ(sim::cuMemCreate(h, kGran, &prop_, 0), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuMemAddressReserve(va, kGran, 0, 0, 0), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuMemMap(*va, kGran, 0, *h, 0), CUDA_SUCCESS);
  }
  CUmemAllocationProp prop_ = {};
};

TEST_F(SimDriverTest, CallsBeforeInitFail) {
  Reset(SimOptions{});
  int n;
  EXPECT_EQ(sim::cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
}

TEST_F(SimDriverTest, CreateRequiresGranularityMultiple) {
  CUmemGenericAllocationHandle h;
  EXPECT_EQ(sim::cuMemCreate(&h, 4096, &prop_, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(sim::cuMemCreate(&h, kGran, &prop_, 0), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemRelease(h), CUDA_SUCCESS);
}

TEST_F(SimDriverTest, MapOnlyIntoReservedUnmappedRanges) {
  CUmemGenericAllocationHandle h;
  ASSERT_EQ(sim::cuMemCreate(&h, kGran, &prop_, 0), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemMap(0x123400000000ull, kGran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr va;
  ASSERT_EQ(sim::cuMemAddressReserve(&va, 2 * kGran, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemMap(va + 4096, kGran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // unaligned
  EXPECT_EQ(sim::cuMemMap(va + kGran, 2 * kGran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(sim::cuMemMap(va, kGran, 0, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemMap(va, kGran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // already mapped
  // Release order: the reservation cannot go while mapped.
  EXPECT_EQ(sim::cuMemAddressFree(va, 2 * kGran), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(sim::cuMemUnmap(va, kGran), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuMemRelease(h), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuMemAddressFree(va, 2 * kGran), CUDA_SUCCESS);
  Usage u = GetUsage();
  EXPECT_EQ(u.handles, 0u);
  EXPECT_EQ(u.mappings, 0u);
  EXPECT_EQ(u.reservations, 0u);
}

TEST_F(SimDriverTest, AccessIsCheckedPerDevice) {
  CUmemGenericAllocationHandle h;
  CUdeviceptr va;
  MapOneGranule(&h, &va);
  int value = 42;
  EXPECT_EQ(DeviceWrite(0, va, &value, sizeof value), CUDA_ERROR_ILLEGAL_ADDRESS);
  CUmemAccessDesc d = {};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(sim::cuMemSetAccess(va, kGran, &d, 1), CUDA_SUCCESS);
  EXPECT_EQ(DeviceWrite(0, va, &value, sizeof value), CUDA_SUCCESS);
  int back = 0;
  EXPECT_EQ(DeviceRead(0, &back, va, sizeof back), CUDA_SUCCESS);
  EXPECT_EQ(back, 42);
  EXPECT_EQ(DeviceRead(1, &back, va, sizeof back), CUDA_ERROR_ILLEGAL_ADDRESS);
  ASSERT_EQ(sim::cuMemUnmap(va, kGran), CUDA_SUCCESS);
  EXPECT_EQ(DeviceRead(0, &back, va, sizeof back), CUDA_ERROR_ILLEGAL_ADDRESS);
  sim::cuMemRelease(h);
  sim::cuMemAddressFree(va, kGran);
}

TEST_F(SimDriverTest, ReleasedHandleLivesUntilUnmapped) {
  CUmemGenericAllocationHandle h;
  CUdeviceptr va;
  MapOneGranule(&h, &va);
  ASSERT_EQ(sim::cuMemRelease(h), CUDA_SUCCESS);
  EXPECT_EQ(DeviceBytesInUse(0), kGran);
  ASSERT_EQ(sim::cuMemUnmap(va, kGran), CUDA_SUCCESS);
  EXPECT_EQ(DeviceBytesInUse(0), 0u);
  sim::cuMemAddressFree(va, kGran);
}

TEST_F(SimDriverTest, OutOfMemoryAndFaultInjection) {
  CUmemGenericAllocationHandle h;
  EXPECT_EQ(sim::cuMemCreate(&h, size_t{128} << 20, &prop_, 0), CUDA_ERROR_OUT_OF_MEMORY);
  FailCall("cuMemCreate", 2, CUDA_ERROR_UNKNOWN);
  ASSERT_EQ(sim::cuMemCreate(&h, kGran, &prop_, 0), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h2;
  EXPECT_EQ(sim::cuMemCreate(&h2, kGran, &prop_, 0), CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(CallCount("cuMemCreate"), 3u);
  sim::cuMemRelease(h);
}

TEST_F(SimDriverTest, ResolverAnswersVersionedAndPerThreadFunctions) {
  DriverApi api = Api();
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st;
  ASSERT_EQ(api.cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, &st), CUDA_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(api.cuMemAlloc_v2));
  ASSERT_EQ(api.cuGetProcAddress_v2("cuMemcpyHtoD", &fn, 13000,
                                    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
            CUDA_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(&sim::cuMemcpyHtoD_v2_ptds));
  EXPECT_EQ(api.cuGetProcAddress_v2("cuNoSuchThing", &fn, 13000, 0, &st), CUDA_SUCCESS);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(api.cuGetProcAddress_v2("cuMemCreate", &fn, 10000, 0, &st), CUDA_SUCCESS);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

}  // namespace
}  // namespace sim_test
}  // namespace vmmshim

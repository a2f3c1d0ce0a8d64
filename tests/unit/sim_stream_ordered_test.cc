// The simulated driver's streams, events and stream-ordered pools keep what
// the real driver did on H200 (examples/stream_ordered_probe.cu,
// docs/stream-ordered.md), so that the shim's stream-ordered path
// can be tested in CI against the driver's own rules.
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

class SimStreamOrderedTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2);
    MakeCurrent(0);
    ASSERT_EQ(sim::cuDeviceGetDefaultMemPool(&pool_, 0), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuStreamCreate(&s1_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuStreamCreate(&s2_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  cuuint64_t Attr(CUmemPool_attribute attr) {
    cuuint64_t v = 0;
    EXPECT_EQ(sim::cuMemPoolGetAttribute(pool_, attr, &v), CUDA_SUCCESS);
    return v;
  }
  CUmemoryPool pool_ = nullptr;
  CUstream s1_ = nullptr, s2_ = nullptr;
};

TEST_F(SimStreamOrderedTest, DefaultPoolIsCurrentAndNamedByItsAllocations) {
  CUmemoryPool current = nullptr;
  ASSERT_EQ(sim::cuDeviceGetMemPool(&current, 0), CUDA_SUCCESS);
  EXPECT_EQ(current, pool_);
  CUdeviceptr p = 0;
  ASSERT_EQ(sim::cuMemAllocAsync(&p, 1 << 20, s1_), CUDA_SUCCESS);
  CUmemoryPool owner = nullptr;
  ASSERT_EQ(sim::cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p),
            CUDA_SUCCESS);
  EXPECT_EQ(owner, pool_);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(sim::cuMemGetAddressRange_v2(&base, &size, p + 10), CUDA_SUCCESS);
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, size_t{1} << 20);
  int reuse = 0;
  ASSERT_EQ(sim::cuMemPoolGetAttribute(pool_, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse),
            CUDA_SUCCESS);
  EXPECT_EQ(reuse, 1);
  EXPECT_EQ(Attr(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0u);
  EXPECT_EQ(Attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), size_t{1} << 20);
  EXPECT_EQ(sim::cuMemFreeAsync(p, s1_), CUDA_SUCCESS);
}

TEST_F(SimStreamOrderedTest, BadInputGetsTheDriversCodes) {
  CUdeviceptr p = 0x5a5a;
  int host = 0;
  EXPECT_EQ(sim::cuMemAllocAsync(nullptr, 256, s1_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(sim::cuMemAllocAsync(&p, 0, s1_), CUDA_SUCCESS);
  EXPECT_EQ(p, 0u);
  p = 0x5a5a;
  EXPECT_EQ(sim::cuMemAllocAsync(&p, size_t{1} << 50, s1_), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(p, 0u);
  EXPECT_EQ(sim::cuMemFreeAsync(0, s1_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(&host), s1_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(sim::cuMemAllocFromPoolAsync(&p, 256, nullptr, s1_), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(sim::cuMemAllocAsync(&p, 256, s1_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemFreeAsync(p, s1_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemFreeAsync(p, s1_), CUDA_ERROR_INVALID_VALUE);  // a double free
}

TEST_F(SimStreamOrderedTest, ReuseFollowsTheStreamOrder) {
  CUdeviceptr x = 0, y = 0;
  ASSERT_EQ(sim::cuMemAllocAsync(&x, 4 << 20, s1_), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuMemFreeAsync(x, s1_), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuMemAllocAsync(&y, 4 << 20, s1_), CUDA_SUCCESS);
  EXPECT_EQ(x, y);  // same stream: at once
  sim::HoldStream(s1_);
  ASSERT_EQ(sim::cuMemFreeAsync(y, s1_), CUDA_SUCCESS);  // s1 busy: not done yet
  CUdeviceptr z = 0;
  ASSERT_EQ(sim::cuMemAllocAsync(&z, 4 << 20, s2_), CUDA_SUCCESS);
  EXPECT_NE(z, y);  // another stream: not while the freeing stream is busy
  ASSERT_EQ(sim::cuMemFreeAsync(z, s2_), CUDA_SUCCESS);
  sim::ReleaseStream(s1_);
  CUdeviceptr w = 0;
  ASSERT_EQ(sim::cuMemAllocAsync(&w, 4 << 20, s2_), CUDA_SUCCESS);
  EXPECT_TRUE(w == y || w == z);  // done now: reusable anywhere
  EXPECT_EQ(sim::cuMemFreeAsync(w, s2_), CUDA_SUCCESS);
}

TEST_F(SimStreamOrderedTest, EventsCompleteWithTheirStreamAndOrderOthers) {
  CUevent e = nullptr;
  ASSERT_EQ(sim::cuEventCreate(&e, 0), CUDA_SUCCESS);
  sim::HoldStream(s1_);
  ASSERT_EQ(sim::cuEventRecord(e, s1_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuEventQuery(e), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(sim::cuStreamWaitEvent(s2_, e, 0), CUDA_SUCCESS);
  CUevent f = nullptr;
  ASSERT_EQ(sim::cuEventCreate(&f, 0), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuEventRecord(f, s2_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuEventQuery(f), CUDA_ERROR_NOT_READY);  // s2 waits on s1
  sim::ReleaseStream(s1_);
  EXPECT_EQ(sim::cuEventQuery(e), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuEventQuery(f), CUDA_SUCCESS);
  sim::HoldStream(s1_);
  ASSERT_EQ(sim::cuEventRecord(e, s1_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuEventSynchronize(e), CUDA_SUCCESS);  // waits for it
  EXPECT_EQ(sim::cuEventQuery(e), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuEventDestroy_v2(e), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuEventDestroy_v2(f), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(SimStreamOrderedTest, FreesAcrossTheTwoFamilies) {
  // cudaFree of stream-ordered memory: 0, the memory goes, the pool still
  // counts it as used (measured); a second free: 1.
  CUdeviceptr a = 0;
  ASSERT_EQ(sim::cuMemAllocAsync(&a, 256, s1_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemFree_v2(a), CUDA_SUCCESS);
  EXPECT_EQ(Attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 512u);
  EXPECT_EQ(sim::cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
  // cudaFreeAsync of cudaMalloc memory frees it; a later cudaFree: 1.
  CUdeviceptr m = 0;
  ASSERT_EQ(sim::cuMemAlloc_v2(&m, 256), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemFreeAsync(m, s1_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemFree_v2(m), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(SimStreamOrderedTest, ReleaseThresholdTrimAndMemGetInfo) {
  size_t before = 0, with = 0, total = 0;
  ASSERT_EQ(sim::cuMemGetInfo_v2(&before, &total), CUDA_SUCCESS);
  CUdeviceptr big = 0;
  ASSERT_EQ(sim::cuMemAllocAsync(&big, 64 << 20, s1_), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuMemGetInfo_v2(&with, &total), CUDA_SUCCESS);
  EXPECT_EQ(before - with, size_t{64} << 20);  // counted
  ASSERT_EQ(sim::cuMemFreeAsync(big, s1_), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuStreamSynchronize(s1_), CUDA_SUCCESS);
  EXPECT_EQ(Attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0u);  // threshold 0: given back
  EXPECT_EQ(Attr(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), size_t{64} << 20);
  cuuint64_t keep = size_t{1} << 30;
  ASSERT_EQ(sim::cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep),
            CUDA_SUCCESS);
  ASSERT_EQ(sim::cuMemAllocAsync(&big, 64 << 20, s1_), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuMemFreeAsync(big, s1_), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuStreamSynchronize(s1_), CUDA_SUCCESS);
  EXPECT_EQ(Attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), size_t{64} << 20);  // kept
  ASSERT_EQ(sim::cuMemPoolTrimTo(pool_, 0), CUDA_SUCCESS);
  EXPECT_EQ(Attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0u);
  EXPECT_EQ(sim::DeviceBytesInUse(0), 0u);
}

TEST_F(SimStreamOrderedTest, PoolAccessCodes) {
  CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  EXPECT_EQ(sim::cuMemPoolGetAccess(&flags, pool_, &loc), CUDA_SUCCESS);
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  loc.id = 1;
  EXPECT_EQ(sim::cuMemPoolGetAccess(&flags, pool_, &loc), CUDA_SUCCESS);
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  loc.id = 2;  // no such device
  EXPECT_EQ(sim::cuMemPoolGetAccess(&flags, pool_, &loc), CUDA_ERROR_INVALID_VALUE);
  CUmemAccessDesc d = {};
  d.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_EQ(sim::cuMemPoolSetAccess(pool_, &d, 1), CUDA_SUCCESS);
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  EXPECT_EQ(sim::cuMemPoolSetAccess(pool_, &d, 1), CUDA_ERROR_INVALID_DEVICE);
  d.location.id = 2;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_EQ(sim::cuMemPoolSetAccess(pool_, &d, 1), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(sim::cuMemPoolSetAccess(pool_, &d, 0), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemPoolSetAccess(pool_, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  d.location.id = 1;  // a peer
  EXPECT_EQ(sim::cuMemPoolSetAccess(pool_, &d, 1), CUDA_SUCCESS);
  loc.id = 1;
  EXPECT_EQ(sim::cuMemPoolGetAccess(&flags, pool_, &loc), CUDA_SUCCESS);
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

TEST_F(SimStreamOrderedTest, CaptureMakesGraphNodesAndCreatedPoolsBecomeCurrent) {
  ASSERT_EQ(sim::cuStreamBeginCapture_v2(s2_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr g = 0;
  EXPECT_EQ(sim::cuMemAllocAsync(&g, 1 << 20, s2_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuMemFreeAsync(g, s2_), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  EXPECT_EQ(sim::cuStreamEndCapture(s2_, &graph), CUDA_SUCCESS);
  EXPECT_EQ(Attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0u);  // nothing of the pool's

  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemoryPool mine = nullptr;
  ASSERT_EQ(sim::cuMemPoolCreate(&mine, &props), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuDeviceSetMemPool(0, mine), CUDA_SUCCESS);
  CUdeviceptr x = 0;
  ASSERT_EQ(sim::cuMemAllocAsync(&x, 256, s1_), CUDA_SUCCESS);
  CUmemoryPool owner = nullptr;
  ASSERT_EQ(sim::cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, x),
            CUDA_SUCCESS);
  EXPECT_EQ(owner, mine);
  ASSERT_EQ(sim::cuMemFreeAsync(x, s1_), CUDA_SUCCESS);
  EXPECT_EQ(sim::cuDeviceSetMemPool(1, mine), CUDA_ERROR_INVALID_VALUE);  // device 0's pool
  EXPECT_EQ(sim::cuMemPoolDestroy(pool_), CUDA_ERROR_INVALID_VALUE);      // the default
  EXPECT_EQ(sim::cuMemPoolDestroy(mine), CUDA_SUCCESS);
  CUmemoryPool current = nullptr;
  ASSERT_EQ(sim::cuDeviceGetMemPool(&current, 0), CUDA_SUCCESS);
  EXPECT_EQ(current, pool_);
}

}  // namespace
}  // namespace vmmshim

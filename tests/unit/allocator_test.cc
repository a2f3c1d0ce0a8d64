// Contract tests of the VMM allocator on the simulated driver.
#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/context.h"

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/driver/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGran = 2 * kMiB;

class AllocatorTest : public ::testing::Test {
 protected:
  void SetUpSim(sim::SimOptions options) {
    sim::Reset(options);
    ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
    MakeCurrent(0);
    api_ = sim::Api();
  }
  void SetUp() override {
    sim::SimOptions o;
    o.device_count = 4;
    o.memory_per_device = 1024 * kMiB;
    SetUpSim(o);
  }
  void MakeCurrent(int device) {
    CUcontext ctx;
    ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&ctx, device), CUDA_SUCCESS);
    ASSERT_EQ(sim::cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  }
  CUdeviceptr MustAllocate(Allocator& a, size_t bytes) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r.ok() && r->served);
    return r.ok() ? r->ptr : 0;
  }
  static void ExpectNoHandlesOrMappings() {
    sim::Usage u = sim::GetUsage();
    EXPECT_EQ(u.handles, 0u);
    EXPECT_EQ(u.host_handles, 0u);
    EXPECT_EQ(u.mappings, 0u);
  }
  static void ExpectDriverClean() {
    ExpectNoHandlesOrMappings();
    EXPECT_EQ(sim::GetUsage().reservations, 0u);
  }

  DriverApi api_;
};

TEST_F(AllocatorTest, DataRoundTripsThroughOwnerDevice) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  for (size_t bytes : {size_t{1}, size_t{256}, size_t{64 * 1024 + 3}, kGran, 3 * kMiB, 64 * kMiB}) {
    CUdeviceptr p = MustAllocate(a, bytes);
    std::vector<unsigned char> in(bytes), out(bytes);
    for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<unsigned char>(i * 31 + bytes);
    ASSERT_EQ(sim::DeviceWrite(0, p, in.data(), bytes), CUDA_SUCCESS) << bytes;
    ASSERT_EQ(sim::DeviceRead(0, out.data(), p, bytes), CUDA_SUCCESS);
    EXPECT_EQ(in, out);
    ASSERT_TRUE(a.Free(p).ok());
  }
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectDriverClean();
}

TEST_F(AllocatorTest, PointersAre256ByteAlignedAndNeverOverlap) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> size(1, 3 * kMiB);
  std::vector<std::pair<CUdeviceptr, size_t>> live;
  for (int i = 0; i < 400; ++i) {
    size_t bytes = size(rng);
    CUdeviceptr p = MustAllocate(a, bytes);
    EXPECT_EQ(p % 256, 0u);
    // Tag every allocation; a later overlap would corrupt a tag.
    ASSERT_EQ(sim::DeviceWrite(0, p, &i, sizeof i), CUDA_SUCCESS);
    live.push_back({p, bytes});
  }
  for (size_t i = 0; i < live.size(); ++i) {
    int tag = -1;
    ASSERT_EQ(sim::DeviceRead(0, &tag, live[i].first, sizeof tag), CUDA_SUCCESS);
    EXPECT_EQ(tag, static_cast<int>(i));
    absl::StatusOr<PointerInfo> info = a.Find(live[i].first + live[i].second - 1);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->allocation_base, live[i].first);
    EXPECT_EQ(info->allocation_size, live[i].second);
  }
  for (auto [p, n] : live) ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(shim.control().GetStats().live_allocations, 0u);
}

TEST_F(AllocatorTest, TenThousandSmallAllocationsShareGranules) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  std::vector<CUdeviceptr> ptrs;
  for (int i = 0; i < 10000; ++i) ptrs.push_back(MustAllocate(a, 256));
  // 10,000 x 256 B in 512-byte units, aligned as the driver aligns (slab.h):
  // 4.9 MiB, in three blocks of one granule (a new packed block is a
  // quarter of the placement's packed granules, at least one: heap_arena.h):
  // three handles, 6 MiB. Native (H200): 6 MiB.
  EXPECT_LE(sim::DeviceBytesInUse(0), 6 * kMiB);
  EXPECT_EQ(sim::CallCount("cuMemCreate"), 3u);
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 3u);
  for (CUdeviceptr p : ptrs) ASSERT_TRUE(a.Free(p).ok());
  // The empty blocks stay mapped in the cache and count as idle.
  EXPECT_EQ(shim.control().IdleBytes(0), 3 * kGran);
  EXPECT_EQ(shim.control().Trim(), 3 * kGran);
  EXPECT_EQ(shim.control().IdleBytes(0), 0u);
  EXPECT_EQ(sim::DeviceBytesInUse(0), 0u);
}

TEST_F(AllocatorTest, PackedBlocksGrowInLargerSteps) {
  // A new packed block is a quarter of the placement's packed granules held
  // (a power of two, 1 to 8): 1,000 x 64 KiB (62.5 MiB) take 8 blocks of 1
  // granule, 4 of 2 and 4 of 4, 32 granules in 16 handles instead of 32,
  // none of them left empty; a block of several granules reports its whole
  // range, as the driver does for any VMM handle.
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  sim::ResetCallCounts();
  std::vector<CUdeviceptr> ptrs;
  for (int i = 0; i < 1000; ++i) ptrs.push_back(MustAllocate(a, 64 * 1024));
  EXPECT_EQ(sim::CallCount("cuMemCreate"), 16u);
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 16u);
  EXPECT_EQ(a.Find(ptrs.back())->range_size, 4 * kGran);
  EXPECT_EQ(a.Find(ptrs.front())->range_size, kGran);
  EXPECT_EQ(sim::DeviceBytesInUse(0), 32 * kGran);
  for (CUdeviceptr p : ptrs) ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(shim.control().Trim(), 32 * kGran);
  // Out of memory for a larger step: one granule still serves.
  ptrs.clear();
  for (int i = 0; i < 8 * 32; ++i) ptrs.push_back(MustAllocate(a, 64 * 1024));  // 8 full granules
  sim::ResetCallCounts();
  sim::FailCall("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
  const CUdeviceptr more = MustAllocate(a, 64 * 1024);  // a step of 2 granules fails
  EXPECT_EQ(a.Find(more)->range_size, kGran);
  EXPECT_EQ(sim::CallCount("cuMemCreate"), 2u);
  ptrs.push_back(more);
  for (CUdeviceptr p : ptrs) a.Free(p).IgnoreError();
}

TEST_F(AllocatorTest, LargeAllocationsGetOneHandleEach) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  sim::ResetCallCounts();
  CUdeviceptr p1 = MustAllocate(a, 3 * kMiB);
  CUdeviceptr p2 = MustAllocate(a, 4 * kMiB);
  EXPECT_EQ(sim::CallCount("cuMemCreate"), 2u);
  EXPECT_EQ(sim::CallCount("cuMemMap"), 2u);
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 2u);
  EXPECT_EQ(sim::CallCount("cuMemAddressReserve"), 1u);
  absl::StatusOr<PointerInfo> info = a.Find(p1 + 12345);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->range_base, p1);
  EXPECT_EQ(info->range_size, 4 * kMiB);  // rounded up to the granularity
  EXPECT_EQ(info->allocation_size, 3 * kMiB);
  EXPECT_FALSE(info->packed);
  // Past the requested size (inside the rounded handle) is not an allocation.
  EXPECT_FALSE(a.Find(p1 + 3 * kMiB).ok());
  ASSERT_TRUE(a.Free(p1).ok());
  ASSERT_TRUE(a.Free(p2).ok());
  EXPECT_EQ(shim.control().Trim(), 8 * kMiB);  // both were cached
  ExpectNoHandlesOrMappings();
}

TEST_F(AllocatorTest, PackedAllocationsReportTheirGranuleAsRange) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr p = MustAllocate(a, 1000);
  CUdeviceptr q = MustAllocate(a, 1000);
  absl::StatusOr<PointerInfo> info = a.Find(q + 10);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->packed);
  EXPECT_EQ(info->allocation_base, q);
  EXPECT_EQ(info->range_size, kGran);
  EXPECT_LE(info->range_base, p);
  EXPECT_LT(q, info->range_base + kGran);
  // The range agrees with what the driver says about the mapping.
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(api_.cuMemGetAddressRange_v2(&base, &size, q + 10), CUDA_SUCCESS);
  EXPECT_EQ(base, info->range_base);
  EXPECT_EQ(size, info->range_size);
}

TEST_F(AllocatorTest, FreeParityWithTheDriver) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr p = MustAllocate(a, 4096);
  CUdeviceptr big = MustAllocate(a, 8 * kMiB);
  // Interior pointers and double frees inside shim memory: INVALID_VALUE.
  EXPECT_EQ(ToCuResult(a.Free(p + 256)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(ToCuResult(a.Free(big + kGran)), CUDA_ERROR_INVALID_VALUE);
  ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(ToCuResult(a.Free(p)), CUDA_ERROR_INVALID_VALUE);
  ASSERT_TRUE(a.Free(big).ok());
  EXPECT_EQ(ToCuResult(a.Free(big)), CUDA_ERROR_INVALID_VALUE);
  // Pointers outside shim memory are not ours: the caller asks the driver.
  EXPECT_TRUE(IsNotShimMemory(a.Free(0x1234)));
}

TEST_F(AllocatorTest, OutOfMemoryLeaksNothingAndRecovers) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr keep = MustAllocate(a, 800 * kMiB);
  absl::StatusOr<Allocator::Allocation> r = a.Allocate(300 * kMiB);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ToCuResult(r.status()), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(sim::GetUsage().handles, 1u);
  EXPECT_EQ(sim::GetUsage().mappings, 1u);
  ASSERT_TRUE(a.Free(keep).ok());
  CUdeviceptr again = MustAllocate(a, 300 * kMiB);
  ASSERT_TRUE(a.Free(again).ok());
  ExpectNoHandlesOrMappings();
}

TEST_F(AllocatorTest, HugeRequestsFailWithOutOfMemory) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> r = a.Allocate(~size_t{0} - 5);
  EXPECT_EQ(ToCuResult(r.status()), CUDA_ERROR_OUT_OF_MEMORY);
  size_t pitch = 0;
  r = a.AllocatePitch(~size_t{0} / 2, 4, &pitch);
  EXPECT_EQ(ToCuResult(r.status()), CUDA_ERROR_OUT_OF_MEMORY);
  ExpectNoHandlesOrMappings();
}

struct FaultCase {
  const char* entry;
  size_t bytes;
};

class AllocatorFaultTest : public AllocatorTest,
                           public ::testing::WithParamInterface<FaultCase> {};

TEST_P(AllocatorFaultTest, FailureAtAnyStepUndoesItself) {
  const FaultCase& c = GetParam();
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  sim::FailCall(c.entry, 1, CUDA_ERROR_UNKNOWN);
  absl::StatusOr<Allocator::Allocation> r = a.Allocate(c.bytes);
  ASSERT_FALSE(r.ok()) << c.entry;
  EXPECT_EQ(ToCuResult(r.status()), CUDA_ERROR_UNKNOWN);
  ExpectNoHandlesOrMappings();
  EXPECT_EQ(sim::DeviceBytesInUse(0), 0u);
  // The next request succeeds and the memory works.
  CUdeviceptr p = MustAllocate(a, c.bytes);
  int v = 5;
  EXPECT_EQ(sim::DeviceWrite(0, p, &v, sizeof v), CUDA_SUCCESS);
  ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectDriverClean();
}

INSTANTIATE_TEST_SUITE_P(
    EveryStep, AllocatorFaultTest,
    ::testing::Values(FaultCase{"cuMemAddressReserve", 256}, FaultCase{"cuMemCreate", 256},
                      FaultCase{"cuMemMap", 256}, FaultCase{"cuMemSetAccess", 256},
                      FaultCase{"cuMemAddressReserve", 8 * kMiB},
                      FaultCase{"cuMemCreate", 8 * kMiB}, FaultCase{"cuMemMap", 8 * kMiB},
                      FaultCase{"cuMemSetAccess", 8 * kMiB},
                      FaultCase{"cuDeviceGetAttribute", 8 * kMiB},
                      FaultCase{"cuMemGetAllocationGranularity", 8 * kMiB}),
    [](const ::testing::TestParamInfo<FaultCase>& info) {
      return std::string(info.param.entry) + "_" + std::to_string(info.param.bytes);
    });

AllocatorOptions NoCache() {
  AllocatorOptions o;
  o.cache_limit_percent = -1;
  o.cache_limit_bytes = 0;
  return o;
}

TEST_F(AllocatorTest, FailedUnmapKeepsTheAllocationUsable) {
  ShimCore shim(api_, NoCache());
  Allocator& a = shim.allocator();
  CUdeviceptr p = MustAllocate(a, 8 * kMiB);
  sim::FailCall("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(ToCuResult(a.Free(p)), CUDA_ERROR_UNKNOWN);
  int v = 1;
  EXPECT_EQ(sim::DeviceWrite(0, p, &v, sizeof v), CUDA_SUCCESS);
  ASSERT_TRUE(a.Free(p).ok());
  ExpectNoHandlesOrMappings();
}

TEST_F(AllocatorTest, FailedGranuleReleaseDoesNotFailTheFree) {
  ShimCore shim(api_, NoCache());
  Allocator& a = shim.allocator();
  std::vector<CUdeviceptr> ptrs;
  for (int i = 0; i < 2 * 2048; ++i) ptrs.push_back(MustAllocate(a, 1024));  // two granules
  ASSERT_EQ(sim::GetUsage().handles, 2u);
  sim::FailCall("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  for (int i = 0; i < 4096; ++i) ASSERT_TRUE(a.Free(ptrs[i]).ok()) << i;
  EXPECT_EQ(sim::GetUsage().handles, 1u);  // the first stayed mapped
  CUdeviceptr again = MustAllocate(a, 1024);
  ASSERT_TRUE(a.Free(again).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectDriverClean();
}

TEST_F(AllocatorTest, FreeSynchronizesTheOwningContext) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr p = MustAllocate(a, 4096);
  MakeCurrent(2);
  const uint64_t before0 = sim::SyncCount(0), before2 = sim::SyncCount(2);
  ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(sim::SyncCount(0), before0 + 1);
  EXPECT_EQ(sim::SyncCount(2), before2);
}

TEST_F(AllocatorTest, FreeSynchronizesOwnerWithoutCtxSynchronizeV2) {
  api_.cuCtxSynchronize_v2 = nullptr;  // drivers before 13.0
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr p = MustAllocate(a, 8 * kMiB);
  MakeCurrent(1);
  const uint64_t before0 = sim::SyncCount(0), before1 = sim::SyncCount(1);
  ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(sim::SyncCount(0), before0 + 1);
  EXPECT_EQ(sim::SyncCount(1), before1);
  // The caller's context is current again afterwards.
  CUdevice d;
  ASSERT_EQ(sim::cuCtxGetDevice(&d), CUDA_SUCCESS);
  EXPECT_EQ(d, 1);
}

TEST_F(AllocatorTest, DeinitializedDriverMakesFreeForget) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr p = MustAllocate(a, 8 * kMiB);
  sim::FailCall("cuCtxSynchronize_v2", 1, CUDA_ERROR_DEINITIALIZED);
  sim::ResetCallCounts();
  EXPECT_EQ(ToCuResult(a.Free(p)), CUDA_ERROR_DEINITIALIZED);
  EXPECT_EQ(sim::CallCount("cuMemUnmap"), 0u);  // no driver calls after teardown
  EXPECT_FALSE(a.Find(p).ok());
  EXPECT_EQ(shim.control().GetStats().live_allocations, 0u);
}

TEST_F(AllocatorTest, DevicesWithoutVmmAndMissingContextPassThrough) {
  sim::SimOptions o;
  o.device_count = 2;
  o.devices_without_vmm = {1};
  SetUpSim(o);
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  MakeCurrent(1);
  absl::StatusOr<Allocator::Allocation> r = a.Allocate(4096);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->served);
  ASSERT_EQ(sim::cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  r = a.Allocate(4096);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->served);
  EXPECT_EQ(sim::GetUsage().handles, 0u);
}

TEST_F(AllocatorTest, EachDeviceOwnsItsMemoryAndOnlyItCanAccessIt) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  std::vector<CUdeviceptr> ptrs;
  for (int d = 0; d < 4; ++d) {
    MakeCurrent(d);
    ptrs.push_back(MustAllocate(a, 1000));
    ptrs.push_back(MustAllocate(a, 6 * kMiB));
  }
  for (int d = 0; d < 4; ++d) {
    for (int k = 0; k < 2; ++k) {
      CUdeviceptr p = ptrs[2 * d + k];
      EXPECT_EQ(a.Find(p)->device, d);
      int v = d;
      for (int other = 0; other < 4; ++other) {
        EXPECT_EQ(sim::DeviceWrite(other, p, &v, sizeof v),
                  other == d ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS);
      }
    }
  }
  for (CUdeviceptr p : ptrs) ASSERT_TRUE(a.Free(p).ok());
}

TEST_F(AllocatorTest, VaGrowsWithAnotherReservation) {
  AllocatorOptions options;
  options.reservation_bytes = 8 * kMiB;
  ShimCore shim(api_, options);
  Allocator& a = shim.allocator();
  std::vector<CUdeviceptr> ptrs;
  for (int i = 0; i < 6; ++i) ptrs.push_back(MustAllocate(a, 3 * kMiB));  // 4 MiB each
  EXPECT_EQ(sim::GetUsage().reservations, 3u);
  CUdeviceptr huge = MustAllocate(a, 20 * kMiB);  // larger than a reservation
  EXPECT_EQ(sim::GetUsage().reservations, 4u);
  ptrs.push_back(huge);
  for (CUdeviceptr p : ptrs) ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectDriverClean();
}

TEST_F(AllocatorTest, PitchedAllocations) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  size_t pitch = 0;
  absl::StatusOr<Allocator::Allocation> r = a.AllocatePitch(1000, 10, &pitch);
  ASSERT_TRUE(r.ok() && r->served);
  EXPECT_EQ(pitch, 1024u);
  EXPECT_EQ(r->ptr % 256, 0u);
  EXPECT_EQ(a.Find(r->ptr)->allocation_size, 10240u);
}

TEST_F(AllocatorTest, CachedLargeBlockIsReusedWithoutDriverCalls) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr p = MustAllocate(a, 8 * kMiB);
  ASSERT_TRUE(a.Free(p).ok());
  EXPECT_EQ(shim.control().IdleBytes(0), 8 * kMiB);
  sim::ResetCallCounts();
  CUdeviceptr q = MustAllocate(a, 7 * kMiB);  // fits within a quarter: reused
  EXPECT_EQ(q, p);
  for (const char* e : {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemAddressReserve",
                        "cuMemUnmap", "cuMemRelease"}) {
    EXPECT_EQ(sim::CallCount(e), 0u) << e;
  }
  EXPECT_EQ(shim.control().IdleBytes(0), 0u);
  EXPECT_EQ(a.Find(q + 1)->allocation_size, 7 * kMiB);
  int v = 3;
  EXPECT_EQ(sim::DeviceWrite(0, q, &v, sizeof v), CUDA_SUCCESS);
  // Too small a request for the cached block: a new handle instead.
  ASSERT_TRUE(a.Free(q).ok());
  CUdeviceptr small = MustAllocate(a, 2 * kMiB);
  EXPECT_NE(small, p);
  const DeviceStats st = shim.control().GetStats().devices[0];
  EXPECT_EQ(st.cache_hits, 1u);
  EXPECT_EQ(st.cache_misses, 2u);
  // A cached block is not an allocation: freeing it again is a double free.
  EXPECT_EQ(ToCuResult(a.Free(p)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_FALSE(a.Find(p).ok());
}

TEST_F(AllocatorTest, CacheIsBoundedPerDevice) {
  AllocatorOptions o;
  o.cache_limit_percent = -1;
  o.cache_limit_bytes = 8 * kMiB;
  ShimCore shim(api_, o);
  Allocator& a = shim.allocator();
  CUdeviceptr p[3];
  for (auto& x : p) x = MustAllocate(a, 4 * kMiB);
  for (auto& x : p) ASSERT_TRUE(a.Free(x).ok());
  EXPECT_EQ(shim.control().IdleBytes(0), 8 * kMiB);
  EXPECT_EQ(sim::GetUsage().handles, 2u);  // the third went back to the driver
}

TEST_F(AllocatorTest, OutOfMemoryReleasesTheCacheAndRetries) {
  AllocatorOptions o;
  o.cache_limit_percent = 100;
  ShimCore shim(api_, o);
  Allocator& a = shim.allocator();
  CUdeviceptr big = MustAllocate(a, 700 * kMiB);
  ASSERT_TRUE(a.Free(big).ok());
  EXPECT_EQ(shim.control().IdleBytes(0), 700 * kMiB);
  // 500 MiB does not fit next to the cached 700 MiB in 1 GiB, and the cached
  // block is too large to serve it: the cache goes, then the request succeeds.
  CUdeviceptr p = MustAllocate(a, 500 * kMiB);
  EXPECT_EQ(shim.control().IdleBytes(0), 0u);
  EXPECT_EQ(sim::GetUsage().handles, 1u);
  ASSERT_TRUE(a.Free(p).ok());
}

TEST_F(AllocatorTest, CachedBlocksKeepTheirAccessSet) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr p = MustAllocate(a, 4 * kMiB);
  ASSERT_TRUE(a.Free(p).ok());
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());  // granted to the cached block too
  sim::ResetCallCounts();
  CUdeviceptr q = MustAllocate(a, 4 * kMiB);
  EXPECT_EQ(q, p);
  EXPECT_EQ(sim::CallCount("cuMemSetAccess"), 0u);
  char c;
  EXPECT_EQ(sim::DeviceRead(1, &c, q, 1), CUDA_SUCCESS);
}

TEST_F(AllocatorTest, PackedHitMakesNoAllocationDriverCall) {
  // Golden record of driver calls per operation on the fast paths: a cache
  // hit (packed or large) asks only which context is current (the driver's
  // thread-local read); the context's device is remembered per thread.
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr warm = MustAllocate(a, 512);
  CUdeviceptr large = MustAllocate(a, 4 * kMiB);
  ASSERT_TRUE(a.Free(large).ok());
  sim::ResetCallCounts();
  CUdeviceptr p = MustAllocate(a, 512);
  CUdeviceptr q = MustAllocate(a, 4 * kMiB);
  EXPECT_EQ(q, large);
  EXPECT_EQ(sim::CallCount("cuCtxGetCurrent"), 2u);
  EXPECT_EQ(sim::CallCount("cuCtxGetDevice"), 0u);
  for (const char* e : {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemAddressReserve",
                        "cuDeviceGetAttribute", "cuMemGetAllocationGranularity",
                        "cuDeviceGetCount"}) {
    EXPECT_EQ(sim::CallCount(e), 0u) << e;
  }
  // After ForgetContexts (a context was destroyed somewhere) the device is
  // asked for again, once.
  ForgetContexts();
  CUdeviceptr r = MustAllocate(a, 512);
  EXPECT_EQ(sim::CallCount("cuCtxGetDevice"), 1u);
  for (CUdeviceptr x : {p, q, r, warm}) ASSERT_TRUE(a.Free(x).ok());
}

TEST_F(AllocatorTest, ContextSwitchesReachTheRightDevice) {
  // The per-thread memo of the context's device must follow cuCtxSetCurrent.
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUcontext ctx1;
  ASSERT_EQ(sim::cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
  CUdeviceptr on0 = MustAllocate(a, 512);
  ASSERT_EQ(sim::cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
  CUdeviceptr on1 = MustAllocate(a, 512);
  EXPECT_EQ(a.Find(on0)->device, 0);
  EXPECT_EQ(a.Find(on1)->device, 1);
  ASSERT_TRUE(a.Free(on1).ok());
  ASSERT_TRUE(a.Free(on0).ok());
}

TEST_F(AllocatorTest, CacheHitDoesNotWaitForAnotherThreadsDriverCalls) {
  // One thread's new allocation is parked inside cuMemCreate; a cache hit
  // and a free on the same device complete meanwhile (no heap lock is held
  // across the driver call).
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUdeviceptr cached = MustAllocate(a, 4 * kMiB);
  CUdeviceptr small = MustAllocate(a, 512);
  ASSERT_TRUE(a.Free(cached).ok());
  CUcontext ctx;
  ASSERT_EQ(sim::cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  sim::HoldCalls("cuMemCreate");
  std::atomic<CUdeviceptr> cold{0};
  std::thread slow([&] {
    sim::cuCtxSetCurrent(ctx);
    cold = MustAllocate(a, 64 * kMiB);
  });
  ASSERT_TRUE(sim::WaitForHeldCall(10000));
  CUdeviceptr hit = MustAllocate(a, 4 * kMiB);
  EXPECT_EQ(hit, cached);
  ASSERT_TRUE(a.Free(small).ok());
  EXPECT_EQ(cold.load(), 0u);  // still parked in the driver
  sim::ReleaseHeldCalls();
  slow.join();
  ASSERT_NE(cold.load(), 0u);
  EXPECT_EQ(a.Find(cold.load())->allocation_size, 64 * kMiB);
  ASSERT_TRUE(a.Free(cold.load()).ok());
  ASSERT_TRUE(a.Free(hit).ok());
}

TEST_F(AllocatorTest, PeerEnabledDuringANewAllocationIsGranted) {
  // EnablePeer runs while a new block's cuMemCreate is in progress without
  // the heap lock: the block must still end up granted to the peer.
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  CUcontext ctx;
  ASSERT_EQ(sim::cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  sim::HoldCalls("cuMemCreate");
  std::atomic<CUdeviceptr> p{0};
  std::thread t([&] {
    sim::cuCtxSetCurrent(ctx);
    p = MustAllocate(a, 4 * kMiB);
  });
  ASSERT_TRUE(sim::WaitForHeldCall(10000));
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());
  sim::ReleaseHeldCalls();
  t.join();
  ASSERT_NE(p.load(), 0u);
  char c;
  EXPECT_EQ(sim::DeviceRead(1, &c, p.load(), 1), CUDA_SUCCESS);
  EXPECT_TRUE(shim.peers().PeerHasAccess(p.load(), 1).value());
  ASSERT_TRUE(a.Free(p.load()).ok());
}

TEST_F(AllocatorTest, ReleaseContextReleasesOnlyThatContextsMemory) {
  // What cuCtxDestroy / cudaDeviceReset do to a context's cuMemAlloc memory,
  // for shim memory: live, cached and packed, in that context only.
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  const size_t baseline = sim::DeviceBytesInUse(1);
  CUdeviceptr keep = MustAllocate(a, 4 * kMiB);  // primary context of device 0
  CUcontext created;
  ASSERT_EQ(sim::cuCtxCreate_v2(&created, 0, 1), CUDA_SUCCESS);  // now current
  CUdeviceptr live = MustAllocate(a, 8 * kMiB);
  CUdeviceptr small = MustAllocate(a, 4096);
  CUdeviceptr cached = MustAllocate(a, 16 * kMiB);
  ASSERT_TRUE(a.Free(cached).ok());
  EXPECT_GT(sim::DeviceBytesInUse(1), baseline);
  sim::ResetCallCounts();
  EXPECT_EQ(a.ReleaseContext(created, true), 8 * kMiB + 2 * kMiB + 16 * kMiB);
  EXPECT_EQ(sim::CallCount("cuCtxSynchronize_v2"), 1u);
  EXPECT_EQ(sim::DeviceBytesInUse(1), baseline);  // device memory as before
  EXPECT_FALSE(a.Find(live).ok());
  EXPECT_EQ(ToCuResult(a.Free(small)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(shim.control().GetStats().live_allocations, 1u);
  // Allocating again in a new context works; the other context is untouched.
  ASSERT_EQ(sim::cuCtxDestroy_v2(created), CUDA_SUCCESS);
  ASSERT_EQ(sim::cuCtxCreate_v2(&created, 0, 1), CUDA_SUCCESS);
  CUdeviceptr again = MustAllocate(a, 8 * kMiB);
  int v = 5;
  EXPECT_EQ(sim::DeviceWrite(1, again, &v, sizeof v), CUDA_SUCCESS);
  EXPECT_EQ(sim::DeviceWrite(0, keep, &v, sizeof v), CUDA_SUCCESS);
  // A context the shim never served: no driver call at all.
  sim::ResetCallCounts();
  EXPECT_EQ(a.ReleaseContext(reinterpret_cast<CUcontext>(0x1234), true), 0u);
  EXPECT_EQ(sim::CallCount("cuCtxSynchronize_v2"), 0u);
  ASSERT_TRUE(a.Free(again).ok());
  ASSERT_TRUE(a.Free(keep).ok());
}

TEST_F(AllocatorTest, CompressionIsVerifiedAndFallsBack) {
  for (bool supported : {true, false}) {
    SCOPED_TRACE(supported ? "granted" : "unsupported");
    sim::SimOptions o;
    o.device_count = 1;
    o.generic_compression = supported;
    SetUpSim(o);
    AllocatorOptions options;
    options.compression = true;
    ShimCore shim(api_, options);
    Allocator& a = shim.allocator();
    CUdeviceptr p = MustAllocate(a, 4 * kMiB);
    EXPECT_EQ(shim.control().GetStats().devices[0].compression,
              supported ? CompressionState::kGranted : CompressionState::kUnsupported);
    ASSERT_TRUE(a.Free(p).ok());
  }
  // Supported, but the driver's answer does not confirm it: later handles
  // are made without compression.
  sim::SimOptions o;
  o.device_count = 1;
  o.generic_compression = true;
  SetUpSim(o);
  AllocatorOptions options;
  options.compression = true;
  ShimCore shim(api_, options);
  Allocator& a = shim.allocator();
  sim::FailCall("cuMemGetAllocationPropertiesFromHandle", 1, CUDA_ERROR_NOT_SUPPORTED);
  CUdeviceptr p = MustAllocate(a, 4 * kMiB);
  EXPECT_EQ(shim.control().GetStats().devices[0].compression, CompressionState::kNotGranted);
  sim::ResetCallCounts();
  CUdeviceptr q = MustAllocate(a, 64 * kMiB);
  EXPECT_EQ(sim::CallCount("cuMemGetAllocationPropertiesFromHandle"), 0u);
  for (CUdeviceptr x : {p, q}) ASSERT_TRUE(a.Free(x).ok());
}

TEST_F(AllocatorTest, ConcurrentAllocateAndFree) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      CUcontext ctx;
      sim::cuDevicePrimaryCtxRetain(&ctx, t % 2);
      sim::cuCtxSetCurrent(ctx);
      std::mt19937 rng(t);
      std::vector<CUdeviceptr> mine;
      for (int i = 0; i < 1500; ++i) {
        size_t bytes = rng() % 2 ? 1 + rng() % 4096 : 1 + rng() % (3 * kMiB);
        absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes);
        ASSERT_TRUE(r.ok() && r->served);
        mine.push_back(r->ptr);
        if (mine.size() > 16 || rng() % 3 == 0) {
          size_t k = rng() % mine.size();
          ASSERT_TRUE(a.Free(mine[k]).ok());
          mine.erase(mine.begin() + k);
        }
      }
      for (CUdeviceptr p : mine) ASSERT_TRUE(a.Free(p).ok());
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(shim.control().GetStats().live_allocations, 0u);
  EXPECT_EQ(shim.control().GetStats().live_bytes, 0u);
  ASSERT_TRUE(shim.ReleaseAll().ok());
  ExpectDriverClean();
}

}  // namespace
}  // namespace vmmshim

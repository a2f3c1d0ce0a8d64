// Checks, on the real driver, what the shim's batching relies on: one
// cuMemSetAccess over a range covering several adjacent mappings (of
// different physical handles, inside one reservation) succeeds and grants
// every mapping. Prints one line and exits 0 when it holds.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>

#define CHECK(call)                                                        \
  do {                                                                     \
    CUresult r_ = (call);                                                  \
    if (r_ != CUDA_SUCCESS) {                                              \
      std::printf("FAIL: %s -> %d\n", #call, static_cast<int>(r_));        \
      return 1;                                                            \
    }                                                                      \
  } while (0)

int main() {
  cudaFree(nullptr);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const int kHandles = 3;
  CUdeviceptr va = 0;
  CHECK(cuMemAddressReserve(&va, kHandles * g, g, 0, 0));
  CUmemGenericAllocationHandle h[kHandles];
  for (int i = 0; i < kHandles; ++i) {
    CHECK(cuMemCreate(&h[i], g, &prop, 0));
    CHECK(cuMemMap(va + i * g, g, 0, h[i], 0));
  }
  CUmemAccessDesc d = {};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK(cuMemSetAccess(va, kHandles * g, &d, 1));  // one call, three mappings
  CHECK(cuMemsetD8(va, 0x5a, kHandles * g));
  unsigned char last = 0;
  CHECK(cuMemcpyDtoH(&last, va + kHandles * g - 1, 1));
  CHECK(cuMemUnmap(va, kHandles * g));  // one call, three mappings
  for (int i = 0; i < kHandles; ++i) CHECK(cuMemRelease(h[i]));
  CHECK(cuMemAddressFree(va, kHandles * g));
  std::printf("one cuMemSetAccess and one cuMemUnmap over %d adjacent mappings: ok (byte %#x)\n",
              kHandles, last);
  return last == 0x5a ? 0 : 1;
}

/* An unmodified driver-API program linked with -lcuda. Run under
 * LD_PRELOAD=libvmmshim.so on the simulated libcuda.so.1, it checks that its
 * allocations work, keep the driver's return codes, and (mode "vmm") come
 * from VMM memory or (mode "native") reach the driver unchanged.
 * Mode "inject": run with SIMCUDA_FAIL=cuMemCreate:1:2; the first allocation
 * fails with CUDA_ERROR_OUT_OF_MEMORY and the next one succeeds. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned long long simcuCallCount(const char* entry);
size_t simcuLiveHandles(void);

#include "expect.h"

#define N 2000

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "vmm";
  const int vmm = strcmp(mode, "native") != 0;
  CUdevice dev;
  CUcontext ctx;
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);

  if (strcmp(mode, "inject") == 0) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc(&p, 4096), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(simcuLiveHandles(), 0);
    EXPECT_EQ(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
    printf(failures ? "FAILED\n" : "OK\n");
    return failures != 0;
  }

  size_t free_at_start = 0, total_at_start = 0;
  EXPECT_EQ(cuMemGetInfo(&free_at_start, &total_at_start), CUDA_SUCCESS);

  /* Driver parity on bad input: the shim hands these to the driver. */
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(NULL, 256), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree((CUdeviceptr)0x1234), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemGetInfo(NULL, NULL), CUDA_SUCCESS); /* as the real driver */
  EXPECT_EQ(cuMemFree(0), CUDA_SUCCESS);
  size_t pitch = 0;
  EXPECT_EQ(cuMemAllocPitch(&p, &pitch, 100, 4, 3), CUDA_ERROR_INVALID_VALUE);

  /* Mixed sizes with data, checked after everything is allocated. */
  static CUdeviceptr ptrs[N];
  static size_t sizes[N];
  size_t total = 0;
  for (int i = 0; i < N; ++i) {
    sizes[i] = (i % 50 == 0) ? (size_t)(1 + i % 7) << 20 : (size_t)(256 + (i * 97) % 6000);
    EXPECT_EQ(cuMemAlloc(&ptrs[i], sizes[i]), CUDA_SUCCESS);
    EXPECT_EQ(ptrs[i] % 256, 0);
    int tag[2] = {i, (int)sizes[i]};
    EXPECT_EQ(cuMemcpyHtoD(ptrs[i], tag, sizeof tag), CUDA_SUCCESS);
    EXPECT_EQ(cuMemsetD8(ptrs[i] + sizes[i] - 1, (unsigned char)i, 1), CUDA_SUCCESS);
    total += sizes[i];
  }
  for (int i = 0; i < N; ++i) {
    int tag[2] = {-1, -1};
    unsigned char last = 0;
    EXPECT_EQ(cuMemcpyDtoH(tag, ptrs[i], sizeof tag), CUDA_SUCCESS);
    EXPECT_EQ(cuMemcpyDtoH(&last, ptrs[i] + sizes[i] - 1, 1), CUDA_SUCCESS);
    EXPECT_EQ(tag[0], i);
    EXPECT_EQ(tag[1], (int)sizes[i]);
    EXPECT_EQ(last, (unsigned char)i);
  }

  /* Pointer queries. */
  CUdeviceptr base = 0;
  size_t range = 0;
  EXPECT_EQ(cuMemGetAddressRange(&base, &range, ptrs[1] + 100), CUDA_SUCCESS);
  if (vmm) {
    EXPECT_EQ(range, 2 << 20); /* a packed allocation reports its granule */
  } else {
    EXPECT_EQ(base, ptrs[1]);
  }
  EXPECT_EQ(cuMemGetAddressRange(NULL, &range, ptrs[50]), CUDA_SUCCESS);
  CUcontext owner = NULL;
  int ordinal = -1;
  EXPECT_EQ(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, ptrs[3]), CUDA_SUCCESS);
  EXPECT_EQ((long long)owner, (long long)ctx);
  EXPECT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptrs[3]),
            CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 0);
  CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  CUdeviceptr abase = 0;
  size_t asize = 0;
  void* data[2] = {&abase, &asize};
  EXPECT_EQ(cuPointerGetAttributes(2, attrs, data, ptrs[1] + 100), CUDA_SUCCESS);
  EXPECT_EQ(abase, base);
  EXPECT_EQ(cuMemGetAddressRange(&base, &range, ptrs[1] + 100), CUDA_SUCCESS);
  EXPECT_EQ(asize, range);

  size_t free_bytes = 0, total_bytes = 0;
  EXPECT_EQ(cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes <= total_bytes, 1);

  /* Pitch. */
  EXPECT_EQ(cuMemAllocPitch(&p, &pitch, 1000, 8, 4), CUDA_SUCCESS);
  EXPECT_EQ(pitch >= 1000, 1);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);

  /* Out of memory, then recovery. */
  p = 12345;
  EXPECT_EQ(cuMemAlloc(&p, (size_t)1 << 40), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(p, 0); /* the driver zeroes the out-pointer on failure */
  EXPECT_EQ(cuMemAlloc(&p, 1 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);

  for (int i = 0; i < N; ++i) EXPECT_EQ(cuMemFree(ptrs[i]), CUDA_SUCCESS);
  /* Double free and interior pointers. */
  EXPECT_EQ(cuMemFree(ptrs[7]), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p + 256), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);

  unsigned long long creates = simcuCallCount("cuMemCreate");
  if (vmm) {
    EXPECT_EQ(creates > 0, 1);
    /* Freed memory stays cached, and counts as free memory. */
    size_t free_after = 0;
    EXPECT_EQ(cuMemGetInfo(&free_after, &total_bytes), CUDA_SUCCESS);
    EXPECT_EQ(free_after, free_at_start);
    int (*release)(int, size_t*) = (int (*)(int, size_t*))dlsym(RTLD_DEFAULT,
                                                                 "vmmshim_release_cached_memory");
    size_t released = 0;
    EXPECT_EQ(release != NULL, 1);
    if (release) EXPECT_EQ(release(-1, &released), CUDA_SUCCESS);
    EXPECT_EQ(released > 0, 1);
    EXPECT_EQ(simcuLiveHandles(), 0);
    EXPECT_EQ(cuMemGetInfo(&free_after, &total_bytes), CUDA_SUCCESS);
    EXPECT_EQ(free_after, free_at_start);
  } else {
    EXPECT_EQ(creates, 0);
  }
  printf("%s: %d allocations, %zu bytes, cuMemCreate calls %llu\n",
         failures ? "FAILED" : "OK", N, total, creates);
  return failures != 0;
}

/* A small driver-API program (linked with -lcuda) for machines without a GPU:
 * the README's demo runs it under LD_PRELOAD=libvmmshim.so on the simulated
 * libcuda.so.1 and shows that its allocations are served from VMM memory.
 * It runs unchanged on a real GPU too. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                            \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      fprintf(stderr, "%s failed: %d\n", #call, (int)r_);                      \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  static CUdeviceptr ptrs[1000];
  size_t bytes = 0;
  for (int i = 0; i < 1000; ++i) {
    size_t n = i % 100 == 0 ? (size_t)(i / 100 + 1) << 20 : 256 + (size_t)i * 16;
    CHECK(cuMemAlloc(&ptrs[i], n));
    CHECK(cuMemcpyHtoD(ptrs[i], &i, sizeof i));
    bytes += n;
  }
  int bad = 0;
  for (int i = 0; i < 1000; ++i) {
    int v = -1;
    CHECK(cuMemcpyDtoH(&v, ptrs[i], sizeof v));
    bad += v != i;
  }
  CUdeviceptr base;
  size_t range;
  CHECK(cuMemGetAddressRange(&base, &range, ptrs[1]));
  printf("driver_api_demo: 1000 allocations (%zu bytes), %d wrong values; the 256-byte "
         "allocation lives in a %zu-byte range\n", bytes, bad, range);
  for (int i = 0; i < 1000; ++i) CHECK(cuMemFree(ptrs[i]));
  return bad != 0;
}

/* A small driver-API program (linked with -lcuda) for machines without a GPU:
 * the README's demo runs it under LD_PRELOAD=libvmmshim.so on the simulated
 * libcuda.so.1 and shows that its allocations are served from VMM memory.
 * It runs unchanged on a real GPU too. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#include "driver_check.h"

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
  /* What cuMemGetAddressRange says of one allocation, checked as a program
   * may rely on it: a range that holds the bytes asked for. Its base and size
   * are the allocator's choice (natively the request rounded up; under the
   * shim the physical handle backing it, a 2 MiB granule shared by small
   * allocations), so they are not printed and the output is the same either
   * way. */
  CUdeviceptr base;
  size_t range;
  CHECK(cuMemGetAddressRange(&base, &range, ptrs[1]));
  const size_t asked = 256 + 16;
  const int range_ok = base <= ptrs[1] && ptrs[1] + asked <= base + range;
  printf("driver_api_demo: 1000 allocations (%zu bytes), %d wrong values; "
         "cuMemGetAddressRange of a %zu-byte allocation: %s\n",
         bytes, bad, asked, range_ok ? "a range that holds it" : "WRONG");
  bad += !range_ok;
  for (int i = 0; i < 1000; ++i) CHECK(cuMemFree(ptrs[i]));
  return bad != 0;
}

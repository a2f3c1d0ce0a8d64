/* A library that allocates through the stand-in shared cudart
 * (history_runtime.c): the shim should name this library, not libcudart. */
#include <cuda.h>

int runtime_malloc(CUdeviceptr* p, size_t bytes);

__attribute__((noinline, visibility("default"))) int caller_allocate(CUdeviceptr* p, size_t bytes) {
  int r = runtime_malloc(p, bytes);
  __asm__ volatile("" ::: "memory");  /* keep the call a call, not a jump */
  return r;
}

/* A direct driver call, as a library with static cudart makes it. */
__attribute__((noinline, visibility("default"))) int caller_allocate_direct(CUdeviceptr* p, size_t bytes) {
  int r = (int)cuMemAlloc(p, bytes);
  __asm__ volatile("" ::: "memory");
  return r;
}

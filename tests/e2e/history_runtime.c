/* A stand-in for the shared libcudart (built as libcudart.so): its
 * runtime_malloc calls cuMemAlloc as cudaMalloc does, so that the shim's
 * caller attribution must look past it, up the stack, to the library that
 * called it (core/history/caller_library.h). */
#include <cuda.h>

/* Not a tail call: a frame of its own, as cudaMalloc has. */
__attribute__((noinline, visibility("default"))) int runtime_malloc(CUdeviceptr* p, size_t bytes) {
  volatile int frame_padding[16] = {0};
  CUresult r = cuMemAlloc(p, bytes);
  return (int)r + frame_padding[0];
}

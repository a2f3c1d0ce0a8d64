// CHECK_CUDA(call): prints the failing runtime call and exits. Shared by the
// CUDA examples, which check every call (exit status 0 proves nothing).
#ifndef VMMSHIM_EXAMPLES_CUDA_CHECK_H_
#define VMMSHIM_EXAMPLES_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(call)                                                         \
  do {                                                                           \
    cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call,       \
                   cudaGetErrorString(e_));                                      \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

#endif  // VMMSHIM_EXAMPLES_CUDA_CHECK_H_

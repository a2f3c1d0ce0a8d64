// Device memory used by N x cudaMalloc(bytes), measured with cudaMemGetInfo.
//   footprint [count] [bytes]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int count = argc > 1 ? std::atoi(argv[1]) : 10000;
  const size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 256;
  cudaFree(nullptr);  // create the context first: it uses memory too
  size_t free_before = 0, free_after = 0, total = 0;
  if (cudaMemGetInfo(&free_before, &total) != cudaSuccess) return 1;
  std::vector<void*> ptrs(count);
  for (int i = 0; i < count; ++i) {
    if (cudaMalloc(&ptrs[i], bytes) != cudaSuccess) {
      std::fprintf(stderr, "cudaMalloc %d failed\n", i);
      return 1;
    }
  }
  cudaMemGetInfo(&free_after, &total);
  std::printf("footprint: %d x %zu B used %.2f MiB of device memory\n", count, bytes,
              (free_before - free_after) / 1048576.0);
  for (void* p : ptrs) cudaFree(p);
  return 0;
}

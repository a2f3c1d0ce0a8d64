// A plain CUDA program (nvcc links cudart statically by default) that makes
// thousands of device allocations of mixed sizes, from 256 B to 1 GiB, runs a
// kernel on every one and checks every result. Run it with and without
// LD_PRELOAD=libvmmshim.so; it prints the same checksum either way.
//
//   alloc_mix [rounds]
#include <cuda_runtime.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

// Fills words with a pattern that depends on the buffer's id and the index.
__global__ void Fill(uint32_t* data, size_t words, uint32_t id) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x) {
    data[i] = id * 2654435761u ^ static_cast<uint32_t>(i * 40503u);
  }
}

// Counts words that do not hold the pattern, and sums them all.
__global__ void Verify(const uint32_t* data, size_t words, uint32_t id,
                       unsigned long long* bad, unsigned long long* sum) {
  unsigned long long local_bad = 0, local_sum = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t want = id * 2654435761u ^ static_cast<uint32_t>(i * 40503u);
    local_bad += data[i] != want;
    local_sum += data[i];
  }
  atomicAdd(bad, local_bad);
  atomicAdd(sum, local_sum);
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  // 256 B .. 1 GiB: many small, some medium, a few large.
  std::vector<size_t> sizes;
  for (int i = 0; i < 3000; ++i) sizes.push_back(256 + (i * 7919) % 65536);
  for (int i = 0; i < 200; ++i) sizes.push_back((size_t{1} << 20) + i * 12345);
  for (int i = 0; i < 40; ++i) sizes.push_back((size_t{8} << 20) * (1 + i % 8));
  sizes.push_back(size_t{256} << 20);
  sizes.push_back(size_t{1} << 30);

  unsigned long long *bad = nullptr, *sum = nullptr;
  CHECK_CUDA(cudaMalloc(&bad, sizeof *bad));
  CHECK_CUDA(cudaMalloc(&sum, sizeof *sum));
  unsigned long long checksum = 0, total_bad = 0, allocations = 2;
  size_t bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<uint32_t*> ptrs(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      CHECK_CUDA(cudaMalloc(&ptrs[i], sizes[i]));
      if (reinterpret_cast<uintptr_t>(ptrs[i]) % 256 != 0) {
        std::fprintf(stderr, "allocation %zu is not 256-byte aligned\n", i);
        return 1;
      }
      ++allocations;
      bytes += sizes[i];
      const size_t words = sizes[i] / 4;
      Fill<<<std::min<size_t>(1024, (words + 255) / 256), 256>>>(ptrs[i], words,
                                                                  static_cast<uint32_t>(i + r));
      CHECK_CUDA(cudaGetLastError());
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      const size_t words = sizes[i] / 4;
      CHECK_CUDA(cudaMemset(bad, 0, sizeof *bad));
      CHECK_CUDA(cudaMemset(sum, 0, sizeof *sum));
      Verify<<<std::min<size_t>(1024, (words + 255) / 256), 256>>>(
          ptrs[i], words, static_cast<uint32_t>(i + r), bad, sum);
      CHECK_CUDA(cudaGetLastError());
      unsigned long long h_bad = 0, h_sum = 0;
      CHECK_CUDA(cudaMemcpy(&h_bad, bad, sizeof h_bad, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(&h_sum, sum, sizeof h_sum, cudaMemcpyDeviceToHost));
      total_bad += h_bad;
      checksum = checksum * 1000003u + h_sum;
    }
    // Free in an order different from allocation: odd ones first.
    for (size_t i = 1; i < ptrs.size(); i += 2) CHECK_CUDA(cudaFree(ptrs[i]));
    for (size_t i = 0; i < ptrs.size(); i += 2) CHECK_CUDA(cudaFree(ptrs[i]));
  }
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaFree(sum));
  std::printf("alloc_mix: %llu allocations, %zu bytes, %d rounds, bad words %llu, checksum %llx\n",
              allocations, bytes, rounds, total_bad, checksum);
  if (total_bad != 0) {
    std::printf("FAILED\n");
    return 1;
  }
  std::printf("PASSED\n");
  return 0;
}

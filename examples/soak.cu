// Soak: allocation churn with kernels for a given time. Random sizes from
// 256 B to 256 MiB (log-uniform), up to 2,000 live buffers; every new buffer
// is filled by a kernel with a pattern of its own, every buffer is checked
// by a kernel before it is freed. At the end everything is freed and free
// device memory (cudaMemGetInfo) must be back to its starting value.
// usage: soak [SECONDS]   (default 180)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda_check.h"

namespace {

__global__ void Fill(unsigned* p, size_t n, unsigned tag) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = tag ^ static_cast<unsigned>(i);
  }
}

__global__ void Check(const unsigned* p, size_t n, unsigned tag, unsigned long long* bad) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (p[i] != (tag ^ static_cast<unsigned>(i))) atomicAdd(bad, 1ULL);
  }
}

struct Buffer {
  unsigned* p;
  size_t words;
  unsigned tag;
};

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 180;
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(nullptr));
  size_t free_start = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_start, &total));
  unsigned long long* bad = nullptr;
  CHECK_CUDA(cudaMalloc(&bad, sizeof *bad));
  CHECK_CUDA(cudaMemset(bad, 0, sizeof *bad));

  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> log_size(8, 28);  // 2^8 .. 2^28 bytes
  std::vector<Buffer> live;
  unsigned long long allocations = 0, frees = 0, kernels = 0, peak_bytes = 0, live_bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (elapsed() < seconds) {
    const bool allocate = live.size() < 50 || (live.size() < 2000 && rng() % 2 == 0);
    if (allocate) {
      const size_t bytes = static_cast<size_t>(std::exp2(log_size(rng))) / 4 * 4 + 4;
      Buffer b{nullptr, bytes / 4, static_cast<unsigned>(rng())};
      cudaError_t e = cudaMalloc(&b.p, bytes);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        continue;
      }
      CHECK_CUDA(e);
      Fill<<<256, 256>>>(b.p, b.words, b.tag);
      CHECK_CUDA(cudaGetLastError());
      ++kernels;
      ++allocations;
      live_bytes += bytes;
      peak_bytes = std::max(peak_bytes, live_bytes);
      live.push_back(b);
    } else {
      const size_t i = rng() % live.size();
      const Buffer b = live[i];
      Check<<<256, 256>>>(b.p, b.words, b.tag, bad);
      CHECK_CUDA(cudaGetLastError());
      ++kernels;
      CHECK_CUDA(cudaFree(b.p));
      ++frees;
      live_bytes -= b.words * 4;
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (const Buffer& b : live) {
    Check<<<256, 256>>>(b.p, b.words, b.tag, bad);
    CHECK_CUDA(cudaFree(b.p));
    ++frees;
    ++kernels;
  }
  unsigned long long mismatches = 0;
  CHECK_CUDA(cudaMemcpy(&mismatches, bad, sizeof mismatches, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaDeviceSynchronize());
  size_t free_end = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_end, &total));
  const long long diff_mib =
      (static_cast<long long>(free_end) - static_cast<long long>(free_start)) / (1 << 20);
  const bool ok = mismatches == 0 && diff_mib > -64 && diff_mib < 64;
  std::printf("soak: %.0f s, %llu allocations, %llu frees, %llu kernels, peak %.1f GiB live, "
              "%llu mismatched words; free memory %zu MiB at start, %zu MiB at end (%lld MiB): "
              "%s\n",
              elapsed(), allocations, frees, kernels, peak_bytes / double(1 << 30), mismatches,
              free_start >> 20, free_end >> 20, diff_mib, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

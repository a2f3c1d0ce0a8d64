// cudaDeviceReset, cudaFreeAsync of cudaMalloc memory and compressible
// memory, on a real GPU: an ordinary CUDA program, run natively and under
// LD_PRELOAD=libvmmshim.so. Lines starting with PROBE must be the same in
// both runs; INFO lines may differ.
#include <cstdio>

#include "cuda_check.h"

namespace {

__global__ void Fill(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = v + static_cast<float>(i % 1000);
  }
}

__global__ void Sum(const float* p, size_t n, double* out) {
  double local = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    local += p[i];
  }
  atomicAdd(out, local);
}

double DeviceSum(const float* p, size_t n) {
  double* d;
  CHECK_CUDA(cudaMalloc(&d, sizeof *d));
  CHECK_CUDA(cudaMemset(d, 0, sizeof *d));
  Sum<<<256, 256>>>(p, n, d);
  double h = 0;
  CHECK_CUDA(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(d));
  return h;
}

size_t FreeBytes() {
  size_t free = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free, &total));
  return free;
}

}  // namespace

int main() {
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(nullptr));  // the context exists from here
  const size_t start = FreeBytes();

  // Allocations of every kind, some freed (the shim caches those), then reset.
  float *big = nullptr, *mid = nullptr;
  CHECK_CUDA(cudaMalloc(&big, size_t{1} << 30));
  CHECK_CUDA(cudaMalloc(&mid, size_t{64} << 20));
  void* small[1000];
  for (void*& p : small) CHECK_CUDA(cudaMalloc(&p, 4096));
  for (int i = 0; i < 500; ++i) CHECK_CUDA(cudaFree(small[i]));
  CHECK_CUDA(cudaFree(mid));
  Fill<<<1024, 256>>>(big, (size_t{1} << 30) / sizeof(float), 1.0f);
  CHECK_CUDA(cudaDeviceSynchronize());
  const size_t used = start - FreeBytes();
  CHECK_CUDA(cudaDeviceReset());
  CHECK_CUDA(cudaFree(nullptr));
  const size_t after = FreeBytes();
  const long long diff_mib =
      (static_cast<long long>(after) - static_cast<long long>(start)) / (1 << 20);
  std::printf("INFO free before: %zu MiB; in use before the reset: %zu MiB; free after the "
              "reset: %zu MiB (difference %lld MiB)\n",
              start >> 20, used >> 20, after >> 20, diff_mib);
  std::printf("PROBE free memory back to its starting value after cudaDeviceReset (within "
              "64 MiB): %s\n",
              diff_mib > -64 && diff_mib < 64 ? "yes" : "no");

  // Allocating again after the reset works.
  float* again = nullptr;
  const size_t n = (size_t{256} << 20) / sizeof(float);
  CHECK_CUDA(cudaMalloc(&again, n * sizeof(float)));
  Fill<<<1024, 256>>>(again, n, 2.0f);
  std::printf("PROBE after the reset: allocate, fill, sum = %.1f\n", DeviceSum(again, n));

  // cudaFreeAsync of cudaMalloc memory, after work queued on a stream.
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  float* scratch = nullptr;
  CHECK_CUDA(cudaMalloc(&scratch, n * sizeof(float)));
  Fill<<<1024, 256, 0, stream>>>(scratch, n, 3.0f);
  const cudaError_t freed = cudaFreeAsync(scratch, stream);
  std::printf("PROBE cudaFreeAsync of cudaMalloc memory: %d\n", freed);
  cudaGetLastError();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  float* next = nullptr;
  CHECK_CUDA(cudaMalloc(&next, n * sizeof(float)));
  Fill<<<1024, 256, 0, stream>>>(next, n, 4.0f);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::printf("PROBE allocate after cudaFreeAsync, fill, sum = %.1f\n", DeviceSum(next, n));
  CHECK_CUDA(cudaFree(next));
  CHECK_CUDA(cudaFree(again));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("lifecycle_probe: OK\n");
  return 0;
}

// Copy and kernel throughput into the memory an allocator hands out: does
// device memory served by the shim (VMM mappings) perform as the driver's?
// For cudaMalloc and cudaMallocAsync buffers of 4 MiB and 64 MiB: host to
// device and device to host copies from pageable and pinned host memory, and
// a kernel that reads and writes the buffer. Medians of 20 after 3 warm-up
// runs. bench/run_copy_bench.sh runs it natively and under the shim,
// alternating.
//   copy_bench [--label NAME]  -> CSV: label,metric,bytes,median_gbps
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK(call)                                                             \
  do {                                                                          \
    cudaError_t e_ = (call);                                                    \
    if (e_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));         \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

__global__ void Scale(float* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = p[i] * 1.0001f + 1.0f;
  }
}

template <typename F>
double MedianGbps(size_t bytes, cudaStream_t s, F op) {
  std::vector<double> gbps;
  for (int i = 0; i < 23; ++i) {
    CHECK(cudaStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    op();
    CHECK(cudaStreamSynchronize(s));
    const double sec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 3) gbps.push_back(bytes / sec / 1e9);
  }
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string label = "run";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--label") == 0) label = argv[i + 1];
  }
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("label,metric,bytes,median_gbps\n");
  for (size_t bytes : {size_t{4} << 20, size_t{64} << 20}) {
    std::vector<char> pageable(bytes, 1);
    char* pinned = nullptr;
    CHECK(cudaMallocHost(&pinned, bytes));
    std::memset(pinned, 1, bytes);
    for (bool async : {false, true}) {
      void* d = nullptr;
      if (async) {
        CHECK(cudaMallocAsync(&d, bytes, s));
      } else {
        CHECK(cudaMalloc(&d, bytes));
      }
      const std::string kind = async ? "async" : "malloc";
      auto row = [&](const char* what, double v) {
        std::printf("%s,%s_%s,%zu,%.3f\n", label.c_str(), kind.c_str(), what, bytes, v);
      };
      row("h2d_pageable", MedianGbps(bytes, s, [&] {
            CHECK(cudaMemcpyAsync(d, pageable.data(), bytes, cudaMemcpyHostToDevice, s));
          }));
      row("d2h_pageable", MedianGbps(bytes, s, [&] {
            CHECK(cudaMemcpyAsync(pageable.data(), d, bytes, cudaMemcpyDeviceToHost, s));
          }));
      row("h2d_pinned", MedianGbps(bytes, s, [&] {
            CHECK(cudaMemcpyAsync(d, pinned, bytes, cudaMemcpyHostToDevice, s));
          }));
      row("d2h_pinned", MedianGbps(bytes, s, [&] {
            CHECK(cudaMemcpyAsync(pinned, d, bytes, cudaMemcpyDeviceToHost, s));
          }));
      row("kernel_rw", MedianGbps(2 * bytes, s, [&] {
            Scale<<<264, 256, 0, s>>>(static_cast<float*>(d), bytes / sizeof(float));
          }));
      if (async) {
        CHECK(cudaFreeAsync(d, s));
      } else {
        CHECK(cudaFree(d));
      }
    }
    CHECK(cudaFreeHost(pinned));
  }
  CHECK(cudaStreamSynchronize(s));
  return 0;
}

// A program in the style of CUDA's streamOrderedAllocation sample: vector
// additions whose buffers come from cudaMallocAsync and go back with
// cudaFreeAsync, in four patterns:
//   basic       allocate, copy, add, copy back, free, all on one stream;
//   post-sync   the same with the default pool's release threshold raised
//               (the sample's "streamOrderedAllocationPostSync"), with a
//               synchronize after every iteration;
//   two-stream  produced on one stream, consumed on another after an event,
//               freed there (the freed blocks reused across streams);
//   threads     four host threads, each with its own stream.
// Each pattern prints "RESULT name checksum errors": identical natively and
// under the shim. Figures (times, pool attributes) are "INFO" lines.
//   stream_ordered_sample [iterations]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "cuda_check.h"

namespace {

__global__ void VectorAdd(const float* a, const float* b, float* c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

struct Result {
  double checksum = 0;
  long errors = 0;
};

// One iteration: buffers of n floats from the stream-ordered allocator.
void AddOnce(cudaStream_t produce, cudaStream_t consume, const std::vector<float>& a,
             const std::vector<float>& b, std::vector<float>& c, Result* out) {
  const int n = static_cast<int>(a.size());
  const size_t bytes = n * sizeof(float);
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  CHECK_CUDA(cudaMallocAsync(&da, bytes, produce));
  CHECK_CUDA(cudaMallocAsync(&db, bytes, produce));
  CHECK_CUDA(cudaMemcpyAsync(da, a.data(), bytes, cudaMemcpyHostToDevice, produce));
  CHECK_CUDA(cudaMemcpyAsync(db, b.data(), bytes, cudaMemcpyHostToDevice, produce));
  if (consume != produce) {
    cudaEvent_t ready;
    CHECK_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(ready, produce));
    CHECK_CUDA(cudaStreamWaitEvent(consume, ready, 0));
    CHECK_CUDA(cudaEventDestroy(ready));
  }
  CHECK_CUDA(cudaMallocAsync(&dc, bytes, consume));
  VectorAdd<<<(n + 255) / 256, 256, 0, consume>>>(da, db, dc, n);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaMemcpyAsync(c.data(), dc, bytes, cudaMemcpyDeviceToHost, consume));
  CHECK_CUDA(cudaFreeAsync(da, consume));
  CHECK_CUDA(cudaFreeAsync(db, consume));
  CHECK_CUDA(cudaFreeAsync(dc, consume));
  CHECK_CUDA(cudaStreamSynchronize(consume));
  for (int i = 0; i < n; ++i) {
    if (c[i] != a[i] + b[i]) ++out->errors;
    out->checksum += c[i];
  }
}

std::vector<float> Input(int n, uint32_t seed) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = static_cast<float>(seed >> 8) / 16777216.0f;
  }
  return v;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Report(const char* name, const Result& r, double seconds, int iterations) {
  std::printf("RESULT %s checksum %.6e errors %ld\n", name, r.checksum, r.errors);
  std::printf("INFO %s: %d iterations in %.3f s (%.1f us each)\n", name, iterations, seconds,
              1e6 * seconds / iterations);
}

void PoolInfo(const char* when) {
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t reserved = 0, used = 0, high = 0;
  CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  std::printf("INFO default pool %s: reserved %llu, used %llu, used high %llu bytes\n", when,
              static_cast<unsigned long long>(reserved), static_cast<unsigned long long>(used),
              static_cast<unsigned long long>(high));
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 200;
  int supported = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 0));
  if (!supported) {
    std::printf("stream-ordered allocation not supported on device 0\n");
    return 0;
  }
  const int n = 1 << 20;  // 4 MiB per buffer
  const std::vector<float> a = Input(n, 1), b = Input(n, 2);
  std::vector<float> c(n);
  cudaStream_t s1, s2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  long total_errors = 0;

  Result basic;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) AddOnce(s1, s1, a, b, c, &basic);
  Report("basic", basic, Seconds(t0), iterations);
  total_errors += basic.errors;
  PoolInfo("after basic");

  // The sample's post-sync variant: keep the pool's memory across the
  // synchronizes.
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = UINT64_MAX;
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  Result post_sync;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    AddOnce(s1, s1, a, b, c, &post_sync);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  Report("post-sync", post_sync, Seconds(t0), iterations);
  total_errors += post_sync.errors;
  PoolInfo("after post-sync (threshold max)");

  Result two;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) AddOnce(s1, s2, a, b, c, &two);
  Report("two-stream", two, Seconds(t0), iterations);
  total_errors += two.errors;

  constexpr int kThreads = 4;
  std::vector<Result> per(kThreads);
  std::vector<std::thread> threads;
  t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      CHECK_CUDA(cudaSetDevice(device));
      cudaStream_t s;
      CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      std::vector<float> mine(n);
      for (int i = 0; i < iterations / kThreads; ++i) AddOnce(s, s, a, b, mine, &per[t]);
      CHECK_CUDA(cudaStreamDestroy(s));
    });
  }
  for (std::thread& t : threads) t.join();
  Result all;
  for (const Result& r : per) {
    all.checksum += r.checksum;
    all.errors += r.errors;
  }
  Report("threads", all, Seconds(t0), iterations);
  total_errors += all.errors;

  threshold = 0;
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
  PoolInfo("after the trim");
  CHECK_CUDA(cudaStreamDestroy(s1));
  CHECK_CUDA(cudaStreamDestroy(s2));
  std::printf(total_errors == 0 ? "PASSED\n" : "FAILED\n");
  return total_errors == 0 ? 0 : 1;
}

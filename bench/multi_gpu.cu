// Multi-GPU measurements of per-allocation peer access (run natively and
// under the shim by tools/multi-gpu-run.sh). Needs two GPUs; on one it says so.
//
//   multi_gpu correct            device 0 reads and writes device 1's buffers
//                                that the policy grants; prints one line each
//   multi_gpu fault SIZE         child: device 0 reads a SIZE-byte buffer of
//                                device 1 after enabling peer access; prints
//                                "read ok" or the error (a denied buffer faults)
//   multi_gpu copy               cudaMemcpyPeer device 1 -> 0, 256 MiB, GB/s
//   multi_gpu enable N           time of cudaDeviceEnablePeerAccess with N live
//                                mixed-size allocations on the peer (us)
//   multi_gpu latency            cudaMalloc/cudaFree on device 1, median/p99,
//                                with 0 and 1 peers enabled
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../examples/cuda_check.h"
#include "vmmshim/vmmshim.h"

namespace {

using Clock = std::chrono::steady_clock;
double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

__global__ void AddOne(unsigned int* data, size_t words) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x) {
    data[i] += 1;
  }
}

__global__ void Sum(const unsigned int* data, size_t words, unsigned long long* out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x) {
    s += data[i];
  }
  atomicAdd(out, s);
}

template <typename F>
F Api(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

int Correct() {
  auto set_tag = Api<vmmshim_set_allocation_tag_fn>("vmmshim_set_allocation_tag");
  auto query = Api<vmmshim_query_peer_access_fn>("vmmshim_query_peer_access");
  auto grant = Api<vmmshim_grant_peer_access_fn>("vmmshim_grant_peer_access");
  struct Buffer {
    const char* name;
    size_t bytes;
    const char* tag;
    bool explicit_grant;
    unsigned int* ptr;
  } buffers[] = {{"4 KiB", 4096, nullptr, false, nullptr},
                 {"512 KiB", 512 << 10, nullptr, false, nullptr},
                 {"64 MiB", size_t{64} << 20, nullptr, false, nullptr},
                 {"4 KiB tagged shared", 4096, "shared", false, nullptr},
                 {"8 MiB explicitly granted", size_t{8} << 20, nullptr, true, nullptr}};
  CHECK_CUDA(cudaSetDevice(1));
  for (Buffer& b : buffers) {
    if (set_tag) set_tag(b.tag);
    CHECK_CUDA(cudaMalloc(&b.ptr, b.bytes));
    CHECK_CUDA(cudaMemset(b.ptr, 1, b.bytes));
    if (b.explicit_grant && grant) grant(b.ptr, 0);
  }
  if (set_tag) set_tag(nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  unsigned long long* sum;
  CHECK_CUDA(cudaMalloc(&sum, sizeof *sum));
  int failures = 0;
  for (const Buffer& b : buffers) {
    int allowed = 1;
    if (query && query(b.ptr, 0, &allowed) != 0) allowed = 0;
    if (!allowed) {
      std::printf("correct: %-26s denied\n", b.name);
      continue;
    }
    const size_t words = b.bytes / 4;
    AddOne<<<256, 256>>>(b.ptr, words);  // device 0 writes device 1's memory
    CHECK_CUDA(cudaMemset(sum, 0, sizeof *sum));
    Sum<<<256, 256>>>(b.ptr, words, sum);
    CHECK_CUDA(cudaGetLastError());
    unsigned long long got = 0;
    CHECK_CUDA(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost));
    const bool ok = got == words * 0x01010102ull;
    failures += !ok;
    std::printf("correct: %-26s granted, read+write %s\n", b.name, ok ? "right" : "WRONG");
  }
  CHECK_CUDA(cudaDeviceDisablePeerAccess(1));
  CHECK_CUDA(cudaSetDevice(1));
  for (Buffer& b : buffers) CHECK_CUDA(cudaFree(b.ptr));
  std::printf("correct: %s\n", failures ? "FAILED" : "PASSED");
  return failures != 0;
}

int Fault(size_t bytes) {
  unsigned int* p;
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaMalloc(&p, bytes));
  CHECK_CUDA(cudaMemset(p, 1, bytes));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  unsigned long long* sum;
  CHECK_CUDA(cudaMalloc(&sum, sizeof *sum));
  CHECK_CUDA(cudaMemset(sum, 0, sizeof *sum));
  Sum<<<64, 256>>>(p, bytes / 4, sum);
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) {
    std::printf("fault: %zu-byte buffer: read ok\n", bytes);
  } else {
    std::printf("fault: %zu-byte buffer: %s\n", bytes, cudaGetErrorName(e));
  }
  std::fflush(stdout);
  return 0;
}

int Copy() {
  const size_t bytes = size_t{256} << 20;
  void *src, *dst;
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMemset(src, 7, bytes));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  for (int enabled = 0; enabled < 2; ++enabled) {
    if (enabled) CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
    CHECK_CUDA(cudaMemcpyPeer(dst, 0, src, 1, bytes));  // warm-up
    CHECK_CUDA(cudaDeviceSynchronize());
    const int reps = 10;
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) CHECK_CUDA(cudaMemcpyPeer(dst, 0, src, 1, bytes));
    CHECK_CUDA(cudaDeviceSynchronize());
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    unsigned char probe = 0;
    CHECK_CUDA(cudaMemcpy(&probe, static_cast<char*>(dst) + bytes - 1, 1,
                          cudaMemcpyDeviceToHost));
    std::printf("copy: cudaMemcpyPeer 1->0 256 MiB, peer access %s: %.1f GB/s, value %s\n",
                enabled ? "enabled" : "not enabled", reps * bytes / s / 1e9,
                probe == 7 ? "right" : "WRONG");
  }
  CHECK_CUDA(cudaDeviceDisablePeerAccess(1));
  return 0;
}

int Enable(int n) {
  CHECK_CUDA(cudaSetDevice(1));
  std::vector<void*> ptrs(n);
  for (int i = 0; i < n; ++i) {
    const size_t bytes = i % 100 == 99 ? (size_t{4} << 20) : 256 + (i * 97) % 65536;
    CHECK_CUDA(cudaMalloc(&ptrs[i], bytes));
  }
  CHECK_CUDA(cudaSetDevice(0));
  std::vector<double> us;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
    us.push_back(Us(Clock::now() - t0));
    CHECK_CUDA(cudaDeviceDisablePeerAccess(1));
  }
  std::sort(us.begin(), us.end());
  std::printf("enable: %d live allocations on the peer: cudaDeviceEnablePeerAccess median %.1f us "
              "(min %.1f, max %.1f)\n", n, us[us.size() / 2], us.front(), us.back());
  CHECK_CUDA(cudaSetDevice(1));
  for (void* p : ptrs) CHECK_CUDA(cudaFree(p));
  return 0;
}

int Latency() {
  const size_t sizes[] = {256, 2 << 20, 64 << 20, size_t{1} << 30};
  for (int peers = 0; peers < 2; ++peers) {
    if (peers) {
      CHECK_CUDA(cudaSetDevice(0));
      CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
    }
    CHECK_CUDA(cudaSetDevice(1));
    for (size_t bytes : sizes) {
      std::vector<double> a, f;
      for (int i = 0; i < 53; ++i) {
        void* p;
        const auto t0 = Clock::now();
        CHECK_CUDA(cudaMalloc(&p, bytes));
        const auto t1 = Clock::now();
        CHECK_CUDA(cudaFree(p));
        const auto t2 = Clock::now();
        if (i < 3) continue;
        a.push_back(Us(t1 - t0));
        f.push_back(Us(t2 - t1));
      }
      std::sort(a.begin(), a.end());
      std::sort(f.begin(), f.end());
      std::printf("latency: %d peer(s) enabled, %zu bytes: malloc median %.2f p99 %.2f us, free "
                  "median %.2f p99 %.2f us\n", peers, bytes, a[a.size() / 2], a[a.size() * 99 / 100],
                  f[f.size() / 2], f[f.size() * 99 / 100]);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::printf("multi_gpu: %d GPU(s); these measurements need two\n", devices);
    return 0;
  }
  const std::string mode = argc > 1 ? argv[1] : "correct";
  if (mode == "correct") return Correct();
  if (mode == "fault") return Fault(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4096);
  if (mode == "copy") return Copy();
  if (mode == "enable") return Enable(argc > 2 ? std::atoi(argv[2]) : 1000);
  if (mode == "latency") return Latency();
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}

// What the native host-memory benchmarks (page_lock_speed,
// registration_behind_copies, ring_beside_copy_engine) set up alike: a
// timer, a driver-call check that ends the program naming the call, the
// copy threads' number, MADV_HUGEPAGE host memory written by threads (the
// pinned pool's way, core/heap/pinned_pool.h), and the primary context of
// device 0 with a resident set of 1,000 small allocations (the driver's
// behaviour depends on what is live; the brief asks benchmarks to hold one).
// Header-only: each benchmark is one translation unit.
#ifndef VMMSHIM_BENCH_HOST_COPY_SETUP_H_
#define VMMSHIM_BENCH_HOST_COPY_SETUP_H_

#include <cuda.h>
#include <errno.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace host_copy_setup {

using Clock = std::chrono::steady_clock;
inline double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Ends the program (status 1) when `r` is an error, naming `what`.
inline void Check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, name ? name : "?");
    std::exit(1);
  }
}

// The CPUs the process may use, at most 16 (what the shim's copy threads use).
inline int CopyThreads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 8;
  return std::clamp(CPU_COUNT(&set), 1, 16);
}

// `bytes` of anonymous memory, advised MADV_HUGEPAGE when `huge`; ends the
// program when it cannot be mapped.
inline char* Map(size_t bytes, bool huge) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "%s: mmap of %zu bytes failed\n", program_invocation_short_name, bytes);
    std::exit(1);
  }
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<char*>(p);
}

// Zeroes [p, p + bytes) from `threads` threads, in 2 MiB-aligned parts.
inline void Touch(char* p, size_t bytes, int threads) {
  std::vector<std::thread> pool;
  const size_t part = (bytes / threads + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  for (int t = 0; t < threads; ++t) {
    const size_t from = std::min(bytes, part * t), to = std::min(bytes, from + part);
    if (from < to) pool.emplace_back([=] { std::memset(p + from, 0, to - from); });
  }
  for (std::thread& th : pool) th.join();
}

// Device 0's primary context, made current, with 1,000 small allocations
// live for the program's life.
inline CUcontext PrimaryContextWithResidentSet() {
  Check(cuInit(0), "cuInit");
  CUdevice dev;
  Check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx;
  Check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  for (size_t i = 0; i < 1000; ++i) {
    CUdeviceptr p;
    Check(cuMemAlloc(&p, 256 + (i % 64) * 4096), "cuMemAlloc (resident set)");
  }
  return ctx;
}

}  // namespace host_copy_setup

#endif  // VMMSHIM_BENCH_HOST_COPY_SETUP_H_

// CPU cost of a cache hit and of its free, in process: the Allocator's
// cuMemAlloc and cuMemFree paths without the interposition layer and
// without cudart, with a resident set of 1,000 live allocations (as
// bench/alloc_bench.cc's "_resident" rows hold), on the simulated driver or
// (--real-driver, on a GPU host) on libcuda.so.1. The simulated driver's
// calls on the path (cuCtxGetCurrent, cuCtxSynchronize) take its mutex, which
// the real driver's do not: simulated figures are for comparing builds of the
// shim on one machine. With the real driver the row driver_ctx_get_current
// is the one driver call a hit makes, so the rest of a hit is the shim's own
// and what bench/alloc_bench's cudaMalloc rows add above it is cudart's.
//
//   hit_path_bench [--real-driver] [--iterations N] [--rounds R] [--sizes B,B,...]
//     -> CSV rows on stdout: metric,bytes,median_ns,p10_ns (per call, the
//        best of R rounds of N timed calls each)
// Under valgrind --tool=callgrind use a small --iterations and divide the
// inclusive cost of Allocator::Allocate and Allocator::Free by their calls.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <dlfcn.h>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "tests/sim/sim_driver.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ns(Clock::duration d) { return std::chrono::duration<double, std::nano>(d).count(); }

[[noreturn]] void Fail(const char* what, size_t bytes) {
  std::fprintf(stderr, "hit_path_bench: %s of %zu bytes failed\n", what, bytes);
  std::exit(1);
}

CUdeviceptr MustAllocate(vmmshim::Allocator& a, size_t bytes) {
  absl::StatusOr<vmmshim::Allocator::Allocation> r = a.Allocate(bytes);
  if (!r.ok() || !r->served) Fail("allocation", bytes);
  return r->ptr;
}

struct Figures {
  double median, p10;
};

Figures Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() / 10]};
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20000, rounds = 5;
  bool real_driver = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--real-driver") == 0) real_driver = true;
  }
  std::vector<size_t> sizes = {256, 4096, 65536, size_t{2} << 20, size_t{64} << 20};
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--real-driver") == 0) continue;
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--sizes") == 0) {
      sizes.clear();
      for (char* s = std::strtok(argv[++i], ","); s != nullptr; s = std::strtok(nullptr, ",")) {
        sizes.push_back(std::strtoull(s, nullptr, 10));
      }
    }
  }
  namespace sim = vmmshim::sim;
  vmmshim::DriverApi api;
  if (real_driver) {
    void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (libcuda == nullptr) Fail("dlopen libcuda.so.1", 0);
    api = vmmshim::LoadDriverApi(libcuda, dlsym);
    if (!vmmshim::CheckRequired(api).ok() || api.cuInit(0) != CUDA_SUCCESS) Fail("cuInit", 0);
    CUcontext ctx = nullptr;
    // The primary context made current as cudart does (pushed: the table
    // holds no cuCtxSetCurrent).
    if (api.cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        api.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS) {
      Fail("context", 0);
    }
  } else {
    sim::SimOptions o;
    o.device_count = 1;
    o.memory_per_device = size_t{16} << 30;
    sim::Reset(o);
    if (sim::cuInit(0) != CUDA_SUCCESS) Fail("cuInit", 0);
    CUcontext ctx = nullptr;
    if (sim::cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        sim::cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
      Fail("context", 0);
    }
    api = sim::Api();
  }
  vmmshim::ShimCore shim(api);
  vmmshim::Allocator& a = shim.allocator();

  // The resident set of bench/alloc_bench.cc (log-uniform 256 B .. 8 MiB).
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> logsize(8, 23);
  std::vector<CUdeviceptr> resident(1000);
  for (CUdeviceptr& p : resident) p = MustAllocate(a, static_cast<size_t>(std::exp2(logsize(rng))));

  std::printf("metric,bytes,median_ns,p10_ns\n");
  {
    // What the two clock reads around each call add to its figure.
    std::vector<double> empty(iterations);
    for (double& e : empty) {
      const auto t0 = Clock::now();
      e = Ns(Clock::now() - t0);
    }
    const Figures f = Summarize(empty);
    std::printf("clock_overhead,0,%.1f,%.1f\n", f.median, f.p10);
    // The one driver call of a hit.
    std::vector<double> get(iterations);
    for (double& g : get) {
      CUcontext c = nullptr;
      const auto t0 = Clock::now();
      api.cuCtxGetCurrent(&c);
      g = Ns(Clock::now() - t0);
    }
    const Figures fg = Summarize(get);
    std::printf("driver_ctx_get_current,0,%.1f,%.1f\n", fg.median, fg.p10);
  }
  std::vector<double> alloc_ns(iterations), free_ns(iterations);
  for (size_t bytes : sizes) {
    // Warm: the first allocation of a size may make a block; later ones hit.
    for (int i = 0; i < 3; ++i) {
      if (!a.Free(MustAllocate(a, bytes)).ok()) Fail("free", bytes);
    }
    Figures best_alloc{1e30, 1e30}, best_free{1e30, 1e30};
    for (int r = 0; r < rounds; ++r) {
      for (int i = 0; i < iterations; ++i) {
        const auto t0 = Clock::now();
        const CUdeviceptr p = MustAllocate(a, bytes);
        const auto t1 = Clock::now();
        if (!a.Free(p).ok()) Fail("free", bytes);
        const auto t2 = Clock::now();
        alloc_ns[i] = Ns(t1 - t0);
        free_ns[i] = Ns(t2 - t1);
      }
      const Figures fa = Summarize(alloc_ns), ff = Summarize(free_ns);
      if (fa.median < best_alloc.median) best_alloc = fa;
      if (ff.median < best_free.median) best_free = ff;
    }
    std::printf("hit_malloc,%zu,%.1f,%.1f\n", bytes, best_alloc.median, best_alloc.p10);
    std::printf("hit_free,%zu,%.1f,%.1f\n", bytes, best_free.median, best_free.p10);
    std::fflush(stdout);
  }
  for (CUdeviceptr p : resident) {
    if (!a.Free(p).ok()) Fail("free", 0);
  }
  return 0;
}

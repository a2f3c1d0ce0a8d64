// What the driver itself costs on the shim's paths, measured natively (no
// shim): how the calls every free makes (cuCtxSynchronize of an idle
// context, cuCtxGetCurrent) scale over threads, and what each step of new
// VMM memory costs (cuMemCreate with and without a shareable handle type,
// cuMemMap, one cuMemSetAccess over one handle or over several adjacent
// ones, cuMemUnmap, cuMemRelease), with a resident set of 1,000 cudaMalloc
// allocations live. These figures bound what the allocator can reach
// (docs/performance.md). Medians of microseconds per call; rows
//   metric,bytes,threads,median_us,p99_us,ops_per_s
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void Check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "driver_costs: %s failed: %d\n", what, static_cast<int>(r));
    std::exit(1);
  }
}

void Row(const char* metric, size_t bytes, int threads, std::vector<double> v, double ops = 0) {
  std::sort(v.begin(), v.end());
  const double median = v.empty() ? 0 : v[v.size() / 2];
  const double p99 = v.empty() ? 0 : v[std::min(v.size() - 1, v.size() * 99 / 100)];
  std::printf("%s,%zu,%d,%.3f,%.3f,%.0f\n", metric, bytes, threads, median, p99, ops);
  std::fflush(stdout);
}

// `threads` threads each make `calls` calls of `fn` (after 1,000 unmeasured
// ones); the aggregate rate and the per-call latencies.
template <typename Fn>
void Scaling(const char* metric, int threads, int calls, CUcontext ctx, Fn fn) {
  std::vector<std::vector<double>> lat(threads);
  std::vector<std::thread> pool;
  std::vector<double> seconds(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
      for (int i = 0; i < 1000; ++i) fn(t);
      lat[t].reserve(calls);
      const auto start = Clock::now();
      for (int i = 0; i < calls; ++i) {
        const auto s = Clock::now();
        fn(t);
        lat[t].push_back(Us(Clock::now() - s));
      }
      seconds[t] = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  for (auto& th : pool) th.join();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  const double slowest = *std::max_element(seconds.begin(), seconds.end());
  Row(metric, 0, threads, all, threads * calls / slowest);
}

}  // namespace

int main() {
  if (cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "driver_costs: no usable CUDA device\n");
    return 1;
  }
  CUcontext ctx = nullptr;
  Check(cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  std::printf("metric,bytes,threads,median_us,p99_us,ops_per_s\n");
  // A resident set as alloc_bench's.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> logsize(8, 23);
  std::vector<void*> resident(1000);
  for (void*& p : resident) {
    if (cudaMalloc(&p, static_cast<size_t>(std::exp2(logsize(rng)))) != cudaSuccess) return 1;
  }
  for (int threads : {1, 2, 4, 8}) {
    Scaling("ctx_synchronize", threads, 20000, ctx,
            [](int) { Check(cuCtxSynchronize(), "cuCtxSynchronize"); });
    Scaling("ctx_get_current", threads, 200000, ctx, [](int) {
      CUcontext c;
      Check(cuCtxGetCurrent(&c), "cuCtxGetCurrent");
    });
    Scaling("native_pair_256B", threads, 5000, ctx, [](int) {
      void* p;
      if (cudaMalloc(&p, 256) != cudaSuccess || cudaFree(p) != cudaSuccess) std::exit(1);
    });
  }

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  Check(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "granularity");
  CUmemAccessDesc desc = {};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const int kRounds = 200;
  CUdeviceptr va = 0;
  const size_t span = 64 * gran;
  Check(cuMemAddressReserve(&va, span, gran, 0, 0), "cuMemAddressReserve");
  // One cold block of `n` handles of `each` bytes mapped adjacently, access
  // set once over all of them; each step timed.
  for (bool fd : {false, true}) {
    for (const std::pair<int, size_t>& shape : {std::pair<int, size_t>{1, gran}, {4, gran},
                                                {1, 4 * gran}, {16, gran}, {1, 16 * gran}}) {
      const int n = shape.first;        // handles
      const size_t each = shape.second; // bytes per handle
      prop.requestedHandleTypes = fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                     : CU_MEM_HANDLE_TYPE_NONE;
      std::vector<double> create, map, access, unmap, release, native_alloc, native_free;
      for (int r = 0; r < kRounds + 5; ++r) {
        std::vector<CUmemGenericAllocationHandle> h(n);
        auto t0 = Clock::now();
        for (auto& x : h) Check(cuMemCreate(&x, each, &prop, 0), "cuMemCreate");
        auto t1 = Clock::now();
        for (int i = 0; i < n; ++i) Check(cuMemMap(va + i * each, each, 0, h[i], 0), "cuMemMap");
        auto t2 = Clock::now();
        Check(cuMemSetAccess(va, n * each, &desc, 1), "cuMemSetAccess");
        auto t3 = Clock::now();
        Check(cuMemUnmap(va, n * each), "cuMemUnmap");
        auto t4 = Clock::now();
        for (auto x : h) Check(cuMemRelease(x), "cuMemRelease");
        auto t5 = Clock::now();
        // The same bytes natively, in the same state (alternated per round).
        void* p = nullptr;
        auto t6 = Clock::now();
        if (cudaMalloc(&p, n * each) != cudaSuccess) return 1;
        auto t7 = Clock::now();
        if (cudaFree(p) != cudaSuccess) return 1;
        auto t8 = Clock::now();
        if (r < 5) continue;
        create.push_back(Us(t1 - t0));
        map.push_back(Us(t2 - t1));
        access.push_back(Us(t3 - t2));
        unmap.push_back(Us(t4 - t3));
        release.push_back(Us(t5 - t4));
        native_alloc.push_back(Us(t7 - t6));
        native_free.push_back(Us(t8 - t7));
      }
      const char* kind = fd ? "fd" : "plain";
      auto emit = [&](const char* step, const std::vector<double>& v) {
        char m[64];
        std::snprintf(m, sizeof m, "%s_%s_x%d", step, kind, n);
        Row(m, n * each, 1, v);
      };
      auto emit_native = [&](const char* step, const std::vector<double>& v) {
        char m[64];
        std::snprintf(m, sizeof m, "native_%s_x%d_%s", step, n, kind);
        Row(m, n * each, 1, v);
      };
      emit("create", create);
      emit("map", map);
      emit("set_access", access);
      emit("unmap", unmap);
      emit("release", release);
      emit_native("malloc", native_alloc);
      emit_native("free", native_free);
    }
  }
  Check(cuMemAddressFree(va, span), "cuMemAddressFree");
  for (void* p : resident) cudaFree(p);
  return 0;
}

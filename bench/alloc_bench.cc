// Allocation benchmark: latency of cudaMalloc/cudaFree (median and p99, warm
// and cold) in an otherwise empty process and again with a resident set of
// 1,000 live allocations ("_resident" rows, as a framework holds), a
// multi-threaded churn of random sizes, stream-ordered pairs, and the device
// memory used by 10,000 small allocations. It measures whatever process it runs in;
// bench/run_bench.sh runs it natively and under LD_PRELOAD=libvmmshim.so and
// prints both side by side.
//
// Built twice from this file: with cudart (alloc_bench, for GPUs) and with
// the driver API (alloc_bench_driver, BENCH_DRIVER_API), which also runs on
// the simulated driver for CI's smoke run.
//
//   alloc_bench [--quick] [--label NAME] [--only GROUP,...]   -> CSV rows on stdout
//   (groups: empty, batch, resident, churn, async, footprint, hit; default all):
//   label,metric,bytes,threads,median_us,p99_us,value
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>

#ifdef BENCH_DRIVER_API
#include <cuda.h>
namespace {
CUcontext g_ctx = nullptr;
bool Init() {
  CUdevice dev;
  return cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
         cuDevicePrimaryCtxRetain(&g_ctx, dev) == CUDA_SUCCESS &&
         cuCtxSetCurrent(g_ctx) == CUDA_SUCCESS;
}
void ThreadInit() { cuCtxSetCurrent(g_ctx); }
bool Malloc(void** p, size_t n) {
  CUdeviceptr d;
  if (cuMemAlloc(&d, n) != CUDA_SUCCESS) return false;
  *p = reinterpret_cast<void*>(d);
  return true;
}
bool Free(void* p) { return cuMemFree(reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS; }
bool MemInfo(size_t* free, size_t* total) { return cuMemGetInfo(free, total) == CUDA_SUCCESS; }
using Stream = CUstream;
bool StreamCreate(Stream* s) { return cuStreamCreate(s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS; }
bool StreamSync(Stream s) { return cuStreamSynchronize(s) == CUDA_SUCCESS; }
bool MallocAsync(void** p, size_t n, Stream s) {
  CUdeviceptr d;
  if (cuMemAllocAsync(&d, n, s) != CUDA_SUCCESS) return false;
  *p = reinterpret_cast<void*>(d);
  return true;
}
bool FreeAsync(void* p, Stream s) {
  return cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(p), s) == CUDA_SUCCESS;
}
}  // namespace
#else
#include <cuda_runtime.h>
namespace {
bool Init() { return cudaFree(nullptr) == cudaSuccess; }
void ThreadInit() { cudaSetDevice(0); }
bool Malloc(void** p, size_t n) { return cudaMalloc(p, n) == cudaSuccess; }
bool Free(void* p) { return cudaFree(p) == cudaSuccess; }
bool MemInfo(size_t* free, size_t* total) { return cudaMemGetInfo(free, total) == cudaSuccess; }
using Stream = cudaStream_t;
bool StreamCreate(Stream* s) { return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) == cudaSuccess; }
bool StreamSync(Stream s) { return cudaStreamSynchronize(s) == cudaSuccess; }
bool MallocAsync(void** p, size_t n, Stream s) { return cudaMallocAsync(p, n, s) == cudaSuccess; }
bool FreeAsync(void* p, Stream s) { return cudaFreeAsync(p, s) == cudaSuccess; }
}  // namespace
#endif

namespace {

using Clock = std::chrono::steady_clock;
std::string g_label = "run";
// Appended to the metric names of rows measured with the resident set live
// ("_resident"); empty for rows measured in an otherwise empty process.
std::string g_suffix;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Summary {
  double median, p99;
};
Summary Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

void Row(const char* metric, size_t bytes, int threads, Summary s, double value = 0) {
  std::printf("%s,%s%s,%zu,%d,%.3f,%.3f,%.3f\n", g_label.c_str(), metric, g_suffix.c_str(),
              bytes, threads, s.median, s.p99, value);
  std::fflush(stdout);
}

void Fail(const char* what, size_t bytes) {
  std::fprintf(stderr, "alloc_bench: %s of %zu bytes failed\n", what, bytes);
  std::exit(1);
}

// The shim's cache release, when running under it (cold measurements).
using ReleaseFn = int (*)(int, size_t*);
ReleaseFn Release() {
  static ReleaseFn fn =
      reinterpret_cast<ReleaseFn>(dlsym(RTLD_DEFAULT, "vmmshim_release_cached_memory"));
  return fn;
}

void Latency(size_t bytes, int iterations, bool cold) {
  std::vector<double> alloc_us, free_us, pair_us;
  for (int i = 0; i < iterations + 3; ++i) {
    if (cold && Release() != nullptr) Release()(-1, nullptr);
    void* p = nullptr;
    const auto t0 = Clock::now();
    if (!Malloc(&p, bytes)) Fail("malloc", bytes);
    const auto t1 = Clock::now();
    if (!Free(p)) Fail("free", bytes);
    const auto t2 = Clock::now();
    if (i < 3) continue;  // warm-up
    alloc_us.push_back(Us(t1 - t0));
    free_us.push_back(Us(t2 - t1));
    pair_us.push_back(Us(t2 - t0));
  }
  const char* w = cold ? "cold" : "warm";
  Row((std::string(w) + "_malloc").c_str(), bytes, 1, Summarize(alloc_us));
  Row((std::string(w) + "_free").c_str(), bytes, 1, Summarize(free_us));
  Row((std::string(w) + "_pair").c_str(), bytes, 1, Summarize(pair_us));
}

// `count` allocations in a row, then all freed: per-call latency while many
// buffers are live (the driver keeps its small-allocation chunks then; the
// warm pair above frees the only buffer, and the driver its chunk, each time).
void Batch(size_t bytes, int count) {
  std::vector<void*> ptrs(count);
  std::vector<double> alloc_us, free_us;
  for (auto& p : ptrs) {
    const auto t0 = Clock::now();
    if (!Malloc(&p, bytes)) Fail("batch malloc", bytes);
    alloc_us.push_back(Us(Clock::now() - t0));
  }
  for (void* p : ptrs) {
    const auto t0 = Clock::now();
    if (!Free(p)) Fail("batch free", bytes);
    free_us.push_back(Us(Clock::now() - t0));
  }
  Row("batch_malloc", bytes, 1, Summarize(alloc_us));
  Row("batch_free", bytes, 1, Summarize(free_us));
}

// Each thread keeps up to 32 live allocations of random sizes (log-uniform,
// 256 B .. 8 MiB) and allocates or frees at random; operations per second
// over all threads. Each thread first runs 1,000 unmeasured operations
// (its per-thread state made, caches filled); the clock starts when every
// thread is ready and stops when the last one is done.
void Churn(int threads, int ops_per_thread) {
  std::atomic<bool> failed{false}, go{false};
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  std::vector<std::vector<double>> lat(threads), malloc_lat(threads), free_lat(threads);
  std::vector<Clock::time_point> done(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ThreadInit();
      std::mt19937_64 rng(1234 + t);
      std::uniform_real_distribution<double> logsize(8, 23);  // 2^8 .. 2^23
      std::vector<void*> live;
      // This thread's own vectors, handed over at the end: writing shared
      // ones (their headers side by side) would bounce cache lines between
      // the threads on every operation.
      std::vector<double> all_us, malloc_us, free_us;
      all_us.reserve(ops_per_thread);
      malloc_us.reserve(ops_per_thread);
      free_us.reserve(ops_per_thread);
      auto op = [&](bool timed) {
        if (live.size() < 32 && (live.empty() || rng() % 2)) {
          const size_t bytes = static_cast<size_t>(std::exp2(logsize(rng)));
          void* p = nullptr;
          const auto s = Clock::now();
          if (!Malloc(&p, bytes)) failed = true;
          if (timed) {
            all_us.push_back(Us(Clock::now() - s));
            malloc_us.push_back(all_us.back());
          }
          live.push_back(p);
        } else {
          const size_t k = rng() % live.size();
          const auto s = Clock::now();
          if (!Free(live[k])) failed = true;
          if (timed) {
            all_us.push_back(Us(Clock::now() - s));
            free_us.push_back(all_us.back());
          }
          live.erase(live.begin() + k);
        }
      };
      for (int i = 0; i < 1000; ++i) op(false);
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (int i = 0; i < ops_per_thread; ++i) op(true);
      const auto end = Clock::now();
      for (void* p : live) Free(p);
      done[t] = end;
      lat[t] = std::move(all_us);
      malloc_lat[t] = std::move(malloc_us);
      free_lat[t] = std::move(free_us);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  if (failed) Fail("churn", 0);
  const double seconds =
      std::chrono::duration<double>(*std::max_element(done.begin(), done.end()) - t0).count();
  auto merged = [](const std::vector<std::vector<double>>& per_thread) {
    std::vector<double> all;
    for (const auto& v : per_thread) all.insert(all.end(), v.begin(), v.end());
    return all;
  };
  Row("churn_op", 0, threads, Summarize(merged(lat)), threads * ops_per_thread / seconds);
  Row("churn_malloc", 0, threads, Summarize(merged(malloc_lat)));
  Row("churn_free", 0, threads, Summarize(merged(free_lat)));
}

// Stream-ordered pairs (cudaMallocAsync + cudaFreeAsync, default pool,
// default release threshold) while a resident set of 1,000 stream-ordered
// allocations of mixed sizes (256 B .. 4 MiB) stays live, as a framework's
// would: freed on the allocating stream, or on a second stream (whose
// blocks the first may reuse only once the second's work before the free is
// done; here it has none). No synchronization inside the timed loop.
void AsyncLatency(bool quick) {
  Stream s1, s2;
  if (!StreamCreate(&s1) || !StreamCreate(&s2)) Fail("stream create", 0);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> logsize(8, 22);
  std::vector<void*> resident(quick ? 50 : 1000);
  for (void*& p : resident) {
    const size_t bytes = static_cast<size_t>(std::exp2(logsize(rng)));
    if (!MallocAsync(&p, bytes, s1)) Fail("resident malloc async", bytes);
  }
  StreamSync(s1);
  const size_t sizes[] = {256, 1 << 20, 64 << 20};
  for (bool two : {false, true}) {
    for (size_t bytes : sizes) {
      const int n = quick ? 20 : 2000;
      std::vector<double> alloc_us, free_us, pair_us;
      for (int i = 0; i < n + 200; ++i) {
        void* p = nullptr;
        const auto t0 = Clock::now();
        if (!MallocAsync(&p, bytes, s1)) Fail("malloc async", bytes);
        const auto t1 = Clock::now();
        if (!FreeAsync(p, two ? s2 : s1)) Fail("free async", bytes);
        const auto t2 = Clock::now();
        if (i < 200) continue;  // warm-up
        alloc_us.push_back(Us(t1 - t0));
        free_us.push_back(Us(t2 - t1));
        pair_us.push_back(Us(t2 - t0));
      }
      StreamSync(s1);
      StreamSync(s2);
      const std::string m = two ? "async2s" : "async";
      Row((m + "_malloc_resident").c_str(), bytes, 1, Summarize(alloc_us));
      Row((m + "_free_resident").c_str(), bytes, 1, Summarize(free_us));
      Row((m + "_pair_resident").c_str(), bytes, 1, Summarize(pair_us));
    }
  }
  for (void* p : resident) FreeAsync(p, s1);
  StreamSync(s1);
}

// A resident set, as a framework holds: `count` live cudaMalloc allocations
// of mixed sizes (log-uniform, 256 B .. 8 MiB; about 1.2 GiB for 1,000),
// kept for the rows measured with it. Natively they keep the driver's
// small-allocation chunks alive, so a measured pair is not the empty
// process's chunk release and re-creation.
std::vector<void*> MakeResidentSet(int count) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> logsize(8, 23);
  std::vector<void*> live(count);
  for (void*& p : live) {
    const size_t bytes = static_cast<size_t>(std::exp2(logsize(rng)));
    if (!Malloc(&p, bytes)) Fail("resident malloc", bytes);
  }
  return live;
}

void Footprint(int count) {
  size_t free_before = 0, free_after = 0, total = 0;
  if (Release() != nullptr) Release()(-1, nullptr);
  MemInfo(&free_before, &total);
  std::vector<void*> ptrs(count);
  for (auto& p : ptrs) {
    if (!Malloc(&p, 256)) Fail("footprint malloc", 256);
  }
  MemInfo(&free_after, &total);
  for (void* p : ptrs) Free(p);
  Row("footprint_10000x256B_MiB", 256, 1, {0, 0}, (free_before - free_after) / 1048576.0);
}

// Cached allocations in a tight loop: `pairs` cudaMalloc + cudaFree of
// `bytes` with a resident set live, timed as a whole (no clock read per
// call), so that a cost of some nanoseconds per allocation shows: value =
// nanoseconds per pair (the mean). Five repetitions, the median kept.
// bench/observability_bench.sh compares the shim's options with it.
void HitLoop(size_t bytes, int pairs) {
  void* p = nullptr;
  for (int i = 0; i < 1000; ++i) {  // the cache and the caller's path warm
    if (!Malloc(&p, bytes) || !Free(p)) Fail("hit warm-up", bytes);
  }
  std::vector<double> ns;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    for (int i = 0; i < pairs; ++i) {
      if (!Malloc(&p, bytes) || !Free(p)) Fail("hit", bytes);
    }
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() / pairs);
  }
  Summary s = Summarize(ns);
  Row("hit_pair_ns_resident", bytes, 1, {s.median / 1000, s.p99 / 1000}, s.median);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--label") == 0 && i + 1 < argc) g_label = argv[++i];
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = std::string(",") + argv[++i] + ",";
  }
  auto want = [&](const char* group) {
    return only.empty() || only.find(std::string(",") + group + ",") != std::string::npos;
  };
  if (!Init()) {
    std::fprintf(stderr, "alloc_bench: no usable CUDA device\n");
    return 1;
  }
  std::printf("label,metric,bytes,threads,median_us,p99_us,value\n");
  const size_t sizes[] = {256, 64 << 10, 2 << 20, 64 << 20, size_t{1} << 30};
  for (size_t bytes : sizes) {
    if (!want("empty")) break;
    const int n = quick ? 5 : (bytes >= (size_t{64} << 20) ? 60 : 400);
    Latency(bytes, n, /*cold=*/false);
    Latency(bytes, quick ? 3 : std::max(20, n / 4), /*cold=*/true);
  }
  for (size_t bytes : sizes) {
    if (!want("batch")) break;
    const int count = bytes >= (size_t{1} << 30) ? 8 : bytes >= (size_t{64} << 20) ? 100 : 1000;
    Batch(bytes, quick ? 4 : count);
  }
  // The same latency rows with a resident set of 1,000 live allocations
  // held throughout (metric names "..._resident").
  if (want("resident")) {
    std::vector<void*> resident = MakeResidentSet(quick ? 50 : 1000);
    g_suffix = "_resident";
    for (size_t bytes : sizes) {
      const int n = quick ? 5 : (bytes >= (size_t{64} << 20) ? 60 : 400);
      Latency(bytes, n, /*cold=*/false);
      Latency(bytes, quick ? 3 : std::max(20, n / 4), /*cold=*/true);
    }
    g_suffix.clear();
    for (void* p : resident) Free(p);
  }
  if (want("hit")) {
    std::vector<void*> resident = MakeResidentSet(quick ? 50 : 1000);
    for (size_t bytes : {size_t{256}, size_t{64} << 10, size_t{4} << 20}) {
      // Natively a 4 MiB pair takes about 60 us (no cache): fewer of them.
      HitLoop(bytes, quick ? 2000 : bytes > (size_t{1} << 20) ? 2000 : 20000);
    }
    for (void* p : resident) Free(p);
  }
  if (want("churn")) {
    for (int threads : {1, 2, 4, 8}) Churn(threads, quick ? 200 : 20000);
  }
  if (want("async")) AsyncLatency(quick);
  if (want("footprint")) Footprint(10000);
  return 0;
}

// Multi-GPU measurements of per-allocation peer access (run natively and
// under the shim by tools/gpu/multi-gpu-run.sh), for any number of GPUs. `cold`
// and `pool` also run on one GPU (0 peers only); the others need two.
//
//   multi_gpu correct            every device reads and writes every other
//                                device's buffers that the policy grants;
//                                prints one line per buffer kind
//   multi_gpu fault SIZE         child: device 0 reads a SIZE-byte buffer of
//                                device 1 after enabling peer access; prints
//                                "read ok" or the error (a denied buffer faults)
//   multi_gpu copy               cudaMemcpyPeer device 1 -> 0, 256 MiB, GB/s
//   multi_gpu enable N           time of cudaDeviceEnablePeerAccess with N live
//                                mixed-size allocations on the peer (us)
//   multi_gpu latency            cudaMalloc/cudaFree on device 1, median/p99,
//                                with 0 and 1 peers enabled (repeated
//                                alloc/free: the shim's cache hits)
//   multi_gpu cold [ITERS]       cold cudaMalloc on device 0 (new physical
//                                memory: the shim's cache released before
//                                each) with 0, 1, ..., N-1 peers enabled
//   multi_gpu enable-all [R]     cudaDeviceEnablePeerAccess for every ordered
//                                pair, R live allocations on each device;
//                                times, codes (the 8-peer limit: 711)
//   multi_gpu pool [ITERS]       cudaMallocAsync from device 0's default pool
//                                made accessible to 0, 1, ..., N-1 peers
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
#include "nlohmann/json.hpp"
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

int DeviceCount() {
  int n = 0;
  CHECK_CUDA(cudaGetDeviceCount(&n));
  return n;
}

// Every device owns the five buffers; every other device enables peer access
// to it and, where the shim says the buffer is granted, adds one to each
// word and sums it (the expected sum grows with each writer).
int Correct() {
  auto set_tag = Api<vmmshim_set_allocation_tag_fn>("vmmshim_set_allocation_tag");
  auto query = Api<vmmshim_query_peer_access_fn>("vmmshim_query_peer_access");
  auto grant = Api<vmmshim_grant_peer_access_fn>("vmmshim_grant_peer_access");
  struct Kind {
    const char* name;
    size_t bytes;
    const char* tag;
    bool explicit_grant;
  } kinds[] = {{"4 KiB", 4096, nullptr, false},
               {"512 KiB", 512 << 10, nullptr, false},
               {"64 MiB", size_t{64} << 20, nullptr, false},
               {"4 KiB tagged shared", 4096, "shared", false},
               {"8 MiB explicitly granted", size_t{8} << 20, nullptr, true}};
  constexpr int kKinds = sizeof kinds / sizeof kinds[0];
  const int n = DeviceCount();
  struct Buffer {
    unsigned int* ptr = nullptr;
    unsigned writes = 0;
  };
  std::vector<std::vector<Buffer>> buffers(n, std::vector<Buffer>(kKinds));
  for (int owner = 0; owner < n; ++owner) {
    CHECK_CUDA(cudaSetDevice(owner));
    for (int k = 0; k < kKinds; ++k) {
      if (set_tag) set_tag(kinds[k].tag);
      CHECK_CUDA(cudaMalloc(&buffers[owner][k].ptr, kinds[k].bytes));
      CHECK_CUDA(cudaMemset(buffers[owner][k].ptr, 1, kinds[k].bytes));
      for (int peer = 0; peer < n && kinds[k].explicit_grant && grant; ++peer) {
        if (peer != owner) grant(buffers[owner][k].ptr, peer);
      }
    }
    if (set_tag) set_tag(nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  int right[kKinds] = {}, wrong[kKinds] = {}, denied[kKinds] = {}, query_errors[kKinds] = {};
  int not_capable = 0;
  for (int reader = 0; reader < n; ++reader) {
    CHECK_CUDA(cudaSetDevice(reader));
    unsigned long long* sum;
    CHECK_CUDA(cudaMalloc(&sum, sizeof *sum));
    for (int owner = 0; owner < n; ++owner) {
      if (owner == reader) continue;
      int can = 0;
      CHECK_CUDA(cudaDeviceCanAccessPeer(&can, reader, owner));
      if (!can) {
        ++not_capable;
        continue;
      }
      CHECK_CUDA(cudaDeviceEnablePeerAccess(owner, 0));
      for (int k = 0; k < kKinds; ++k) {
        Buffer& b = buffers[owner][k];
        int allowed = 1;  // natively (no shim) every buffer is mapped into the peer
        if (query) {
          if (const int rc = query(b.ptr, reader, &allowed); rc != 0) {
            ++query_errors[k];
            std::printf("correct: vmmshim_query_peer_access(device %d's %s, %d) = %d\n", owner,
                        kinds[k].name, reader, rc);
            continue;
          }
        }
        if (!allowed) {
          ++denied[k];
          continue;
        }
        const size_t words = kinds[k].bytes / 4;
        AddOne<<<256, 256>>>(b.ptr, words);  // the reader writes the owner's memory
        ++b.writes;
        CHECK_CUDA(cudaMemset(sum, 0, sizeof *sum));
        Sum<<<256, 256>>>(b.ptr, words, sum);
        CHECK_CUDA(cudaGetLastError());
        unsigned long long got = 0;
        CHECK_CUDA(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost));
        if (got == words * (0x01010101ull + b.writes)) {
          ++right[k];
        } else {
          ++wrong[k];
          std::printf("correct: device %d read device %d's %s: WRONG sum %llu\n", reader, owner,
                      kinds[k].name, got);
        }
      }
      CHECK_CUDA(cudaDeviceDisablePeerAccess(owner));
    }
    CHECK_CUDA(cudaFree(sum));
  }
  int failures = 0;
  for (int k = 0; k < kKinds; ++k) {
    failures += wrong[k] + query_errors[k];
    std::printf("correct: %-26s %d ordered pairs: %d granted read+write right, %d wrong, %d "
                "denied, %d query errors\n",
                kinds[k].name, n * (n - 1) - not_capable, right[k], wrong[k], denied[k],
                query_errors[k]);
  }
  if (not_capable) std::printf("correct: %d ordered pairs not peer-capable\n", not_capable);
  for (int owner = 0; owner < n; ++owner) {
    CHECK_CUDA(cudaSetDevice(owner));
    for (Buffer& b : buffers[owner]) CHECK_CUDA(cudaFree(b.ptr));
  }
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

// Median and 90th percentile of `us` (sorted in place).
struct Quantiles {
  double median, p90;
};
Quantiles Summarize(std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 9 / 10]};
}

// A totals counter of the shim's statistics (vmmshim_get_statistics), or -1
// without the shim.
long long ShimTotal(const char* key) {
  auto get = Api<vmmshim_get_statistics_fn>("vmmshim_get_statistics");
  size_t needed = 0;
  if (get == nullptr || get(nullptr, 0, &needed) != 0) return -1;
  std::string doc(needed + 4096, '\0');
  if (get(doc.data(), doc.size(), &needed) != 0) return -1;
  doc.resize(std::strlen(doc.c_str()));
  return nlohmann::json::parse(doc)["totals"].value(key, -1LL);
}

// Whether device `peer` can access device 0's memory.
bool CanBePeerOfDevice0(int peer) {
  int can = 0;
  CHECK_CUDA(cudaDeviceCanAccessPeer(&can, peer, 0));
  return can != 0;
}

// Device `peer` enables peer access to device 0 (its memory then has to be
// mapped into `peer`). Returns false when the pair cannot be peers.
bool EnablePeerOfDevice0(int peer) {
  if (!CanBePeerOfDevice0(peer)) return false;
  CHECK_CUDA(cudaSetDevice(peer));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
  CHECK_CUDA(cudaSetDevice(0));
  return true;
}

const size_t kColdSizes[] = {256, 2 << 20, 64 << 20, size_t{1} << 30};

// Cold allocations: before each timed cudaMalloc the shim's cache is
// released (vmmshim_release_cached_memory, not timed), so each one maps new
// physical memory (with the peers of the policy), as natively. The timed
// allocations carry their own tag, so a small one cannot land in a granule of
// another allocation. A resident set of 256 x 4 MiB stays live on device 0.
int Cold(int iters) {
  auto release = Api<vmmshim_release_cached_memory_fn>("vmmshim_release_cached_memory");
  auto set_tag = Api<vmmshim_set_allocation_tag_fn>("vmmshim_set_allocation_tag");
  const int n = DeviceCount();
  CHECK_CUDA(cudaSetDevice(0));
  std::vector<void*> resident(256);
  for (void*& p : resident) CHECK_CUDA(cudaMalloc(&p, size_t{4} << 20));
  int peers = 0;
  for (int k = 0; k < n; ++k) {
    if (k > 0 && !EnablePeerOfDevice0(k)) {
      std::printf("cold: device %d cannot be a peer of device 0; stopping at %d peers\n", k,
                  peers);
      break;
    }
    peers = k;
    for (size_t bytes : kColdSizes) {
      std::vector<double> a, f, r;
      int released_each = 0;
      for (int i = 0; i < iters + 2; ++i) {  // 2 warm-up allocations not counted
        // The previous allocation's block (freed into the cache) goes back
        // to the driver: what a native cudaFree did inside its own time.
        size_t released = 0;
        const auto t_release = Clock::now();
        if (release) release(0, &released);
        const double release_us = Us(Clock::now() - t_release);
        if (set_tag) set_tag("multi_gpu cold");
        void* p;
        const auto t0 = Clock::now();
        CHECK_CUDA(cudaMalloc(&p, bytes));
        const auto t1 = Clock::now();
        if (set_tag) set_tag(nullptr);
        CHECK_CUDA(cudaFree(p));
        const auto t2 = Clock::now();
        if (i < 2) continue;
        released_each += released >= bytes;
        a.push_back(Us(t1 - t0));
        f.push_back(Us(t2 - t1));
        r.push_back(release_us);
      }
      const Quantiles qa = Summarize(a), qf = Summarize(f), qr = Summarize(r);
      std::printf("cold: %d peer(s) enabled, %zu bytes: malloc median %.2f p90 %.2f us, free "
                  "median %.2f p90 %.2f us; ",
                  peers, bytes, qa.median, qa.p90, qf.median, qf.p90);
      if (release) {
        std::printf("shim cache release before each median %.2f p90 %.2f us, gave back at least "
                    "the previous block's bytes %d of %d times\n",
                    qr.median, qr.p90, released_each, iters);
      } else {
        std::printf("native\n");
      }
    }
  }
  for (void* p : resident) CHECK_CUDA(cudaFree(p));
  return 0;
}

// cudaDeviceEnablePeerAccess for every ordered pair, with `resident` live
// mixed-size allocations on each device (as Enable), three rounds (the first
// is what a program pays; each round ends by disabling every pair).
int EnableAll(int resident) {
  const int n = DeviceCount();
  std::vector<std::vector<void*>> ptrs(n);
  for (int d = 0; d < n; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    for (int i = 0; i < resident; ++i) {
      const size_t bytes = i % 100 == 99 ? (size_t{4} << 20) : 256 + (i * 97) % 65536;
      void* p;
      CHECK_CUDA(cudaMalloc(&p, bytes));
      ptrs[d].push_back(p);
    }
  }
  for (int round = 1; round <= 3; ++round) {
    double total = 0, slowest = 0;
    int slow_from = -1, slow_to = -1, ok = 0, unsupported = 0;
    std::vector<std::string> refused;
    std::vector<std::pair<int, int>> enabled;
    for (int d = 0; d < n; ++d) {
      CHECK_CUDA(cudaSetDevice(d));
      for (int p = 0; p < n; ++p) {
        if (p == d) continue;
        int can = 0;
        CHECK_CUDA(cudaDeviceCanAccessPeer(&can, d, p));
        if (!can) {
          ++unsupported;
          continue;
        }
        const auto t0 = Clock::now();
        const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
        const double us = Us(Clock::now() - t0);
        total += us;
        if (us > slowest) slowest = us, slow_from = d, slow_to = p;
        if (e == cudaSuccess) {
          ++ok;
          enabled.push_back({d, p});
        } else {
          cudaGetLastError();  // the runtime keeps the last error: clear it
          refused.push_back(std::to_string(d) + "->" + std::to_string(p) + " " +
                            cudaGetErrorName(e) + " (" + std::to_string(static_cast<int>(e)) +
                            ")");
        }
      }
    }
    std::printf("enable-all: round %d, %d GPUs, %d live allocations each: %d ordered pairs, "
                "%d enabled, %zu refused, %d not peer-capable; total %.2f ms, slowest %.2f ms "
                "(%d->%d)\n",
                round, n, resident, n * (n - 1), ok, refused.size(), unsupported, total / 1000,
                slowest / 1000, slow_from, slow_to);
    for (const std::string& r : refused) std::printf("enable-all: round %d refused %s\n", round,
                                                     r.c_str());
    for (auto [d, p] : enabled) {
      CHECK_CUDA(cudaSetDevice(d));
      CHECK_CUDA(cudaDeviceDisablePeerAccess(p));
    }
  }
  for (int d = 0; d < n; ++d) {
    CHECK_CUDA(cudaSetDevice(d));
    for (void* p : ptrs[d]) CHECK_CUDA(cudaFree(p));
  }
  return 0;
}

// cudaMallocAsync from device 0's default pool made accessible (cudaMemPool-
// SetAccess) to 0, 1, ..., N-1 peers. Cold: the pool trimmed to 0 (and the
// shim's cache released) after a synchronize before each timed allocation;
// warm: allocate and free on the stream without a synchronize (pool reuse).
// 64 x 4 MiB stream-ordered allocations stay live in the pool.
int Pool(int iters) {
  auto release = Api<vmmshim_release_cached_memory_fn>("vmmshim_release_cached_memory");
  const int n = DeviceCount();
  CHECK_CUDA(cudaSetDevice(0));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<void*> resident(64);
  for (void*& p : resident) CHECK_CUDA(cudaMallocAsync(&p, size_t{4} << 20, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  int peers = 0;
  for (int k = 0; k < n; ++k) {
    if (k > 0) {
      if (!CanBePeerOfDevice0(k)) {
        std::printf("pool: device %d cannot be a peer of device 0; stopping at %d peers\n", k,
                    peers);
        break;
      }
      cudaMemAccessDesc desc = {};
      desc.location.type = cudaMemLocationTypeDevice;
      desc.location.id = k;
      desc.flags = cudaMemAccessFlagsProtReadWrite;
      const auto t0 = Clock::now();
      CHECK_CUDA(cudaMemPoolSetAccess(pool, &desc, 1));
      std::printf("pool: cudaMemPoolSetAccess(device %d) %.1f us\n", k, Us(Clock::now() - t0));
    }
    peers = k;
    for (size_t bytes : kColdSizes) {
      std::vector<double> cold, warm;
      const long long reuses_before = ShimTotal("stream_ordered_reuses");
      for (int i = 0; i < iters + 2; ++i) {
        CHECK_CUDA(cudaStreamSynchronize(stream));
        CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
        if (release) release(0, nullptr);
        void* p;
        const auto t0 = Clock::now();
        CHECK_CUDA(cudaMallocAsync(&p, bytes, stream));
        const auto t1 = Clock::now();
        CHECK_CUDA(cudaFreeAsync(p, stream));
        if (i >= 2) cold.push_back(Us(t1 - t0));
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const long long reuses_cold = ShimTotal("stream_ordered_reuses") - reuses_before;
      for (int i = 0; i < iters + 2; ++i) {
        void* p;
        const auto t0 = Clock::now();
        CHECK_CUDA(cudaMallocAsync(&p, bytes, stream));
        const auto t1 = Clock::now();
        CHECK_CUDA(cudaFreeAsync(p, stream));
        if (i >= 2) warm.push_back(Us(t1 - t0));
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const Quantiles qc = Summarize(cold), qw = Summarize(warm);
      std::printf("pool: %d peer(s) with pool access, %zu bytes: cold malloc median %.2f p90 %.2f "
                  "us, warm median %.2f p90 %.2f us",
                  peers, bytes, qc.median, qc.p90, qw.median, qw.p90);
      if (reuses_before >= 0) {
        std::printf("; shim reuses among the cold ones: %lld\n", reuses_cold);
      } else {
        std::printf("; native\n");
      }
    }
  }
  for (void* p : resident) CHECK_CUDA(cudaFreeAsync(p, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int devices = DeviceCount();
  const std::string mode = argc > 1 ? argv[1] : "correct";
  // A count argument below 1 is taken as 1 (the medians need a sample).
  auto count = [&](int fallback) { return argc > 2 ? std::max(1, std::atoi(argv[2])) : fallback; };
  if (mode == "cold") return Cold(count(30));
  if (mode == "pool") return Pool(count(30));
  if (devices < 2) {
    std::printf("multi_gpu: %d GPU(s); mode %s needs two\n", devices, mode.c_str());
    return 0;
  }
  if (mode == "correct") return Correct();
  if (mode == "fault") return Fault(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4096);
  if (mode == "copy") return Copy();
  if (mode == "enable") return Enable(count(1000));
  if (mode == "enable-all") return EnableAll(count(1000));
  if (mode == "latency") return Latency();
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}

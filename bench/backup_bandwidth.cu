// How fast device memory can be copied to host memory and back, natively,
// by the ways a pause with contents (docs/pause-resume.md) could
// do it, and what releasing and re-creating the physical memory costs (a
// pause without contents). Measured on one buffer of SIZE bytes (default
// 8 GiB) with a resident set of 1,000 cudaMalloc allocations live; each way
// runs ROUNDS times (default 3), the ways alternating, after one warm-up
// round that is not reported. Rows (GiB/s = 2^30 bytes per second of the
// whole step, allocation of host memory included where the way needs it):
//   way,direction,round,seconds,gib_per_s
// Ways:
//   pageable_fresh     cudaMemcpy into / out of new malloc'd memory (the
//                      driver stages it; first touch of every page included)
//   pageable_touched   the same into memory already written once
//   pinned_alloc       cudaHostAlloc of the backup (its time counted) and
//                      one cudaMemcpy each way
//   host_register      malloc + cudaHostRegister (counted) + cudaMemcpy
//   staged_T           pinned staging ring (4 x 64 MiB) on a stream of its
//                      own, chunks overlapped with T CPU threads copying
//                      between staging and new pageable memory (T = 1, 4, 8, 16)
//   staged_T_thp       the same into memory madvise'd MADV_HUGEPAGE (fewer
//                      first-touch faults; T = 8, 16)
//   vmm_release        cuMemUnmap + cuMemRelease of the buffer's handles
//   vmm_recreate       cuMemCreate + cuMemMap + cuMemSetAccess of them
//                      again (H handles of SIZE/H bytes: H = 1, 64)
// usage: backup_bandwidth [SIZE_GIB] [ROUNDS] [WAY_PREFIX]  (only the ways whose
//        names start with WAY_PREFIX; default all)
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "backup_bandwidth: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void Check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "backup_bandwidth: %s failed: %d\n", what, static_cast<int>(r));
    std::exit(1);
  }
}

// Fresh anonymous memory (no page touched yet), as a new backup would be.
char* FreshHost(size_t bytes, bool huge = false) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "backup_bandwidth: mmap of %zu bytes failed\n", bytes);
    std::exit(1);
  }
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<char*>(p);
}
void FreeHost(char* p, size_t bytes) { munmap(p, bytes); }

// Copies `n` bytes with `threads` threads.
void ParallelCopy(char* dst, const char* src, size_t n, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  std::vector<std::thread> pool;
  const size_t part = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const size_t from = std::min(n, part * t), to = std::min(n, from + part);
    pool.emplace_back([=] { std::memcpy(dst + from, src + from, to - from); });
  }
  for (std::thread& t : pool) t.join();
}

constexpr size_t kChunk = size_t{64} << 20;
constexpr int kRing = 4;

// Device -> pageable host through the pinned ring: the DMA of chunk i+1..
// overlaps the CPU copy of chunk i. `to_host`: else host -> device.
void Staged(char* dev, char* host, size_t bytes, int threads, bool to_host, char** ring,
            cudaStream_t stream, cudaEvent_t* done) {
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  auto len = [&](size_t c) { return std::min(kChunk, bytes - c * kChunk); };
  if (to_host) {
    for (size_t c = 0; c < chunks + kRing; ++c) {
      if (c >= kRing) {  // chunk c - kRing has landed in its slot: copy it out
        const size_t k = c - kRing;
        Check(cudaEventSynchronize(done[k % kRing]), "cudaEventSynchronize");
        ParallelCopy(host + k * kChunk, ring[k % kRing], len(k), threads);
      }
      if (c < chunks) {
        Check(cudaMemcpyAsync(ring[c % kRing], dev + c * kChunk, len(c), cudaMemcpyDeviceToHost,
                              stream),
              "cudaMemcpyAsync");
        Check(cudaEventRecord(done[c % kRing], stream), "cudaEventRecord");
      }
    }
  } else {
    for (size_t c = 0; c < chunks; ++c) {
      if (c >= kRing) Check(cudaEventSynchronize(done[c % kRing]), "cudaEventSynchronize");
      ParallelCopy(ring[c % kRing], host + c * kChunk, len(c), threads);
      Check(cudaMemcpyAsync(dev + c * kChunk, ring[c % kRing], len(c), cudaMemcpyHostToDevice,
                            stream),
            "cudaMemcpyAsync");
      Check(cudaEventRecord(done[c % kRing], stream), "cudaEventRecord");
    }
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
}

void Row(const std::string& way, const char* direction, int round, double seconds,
         size_t bytes) {
  if (round < 0) return;  // warm-up
  std::printf("%s,%s,%d,%.4f,%.2f\n", way.c_str(), direction, round, seconds,
              bytes / double(size_t{1} << 30) / seconds);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 8) << 30;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  Check(cudaSetDevice(0), "cudaSetDevice");
  Check(cudaFree(nullptr), "cudaFree(0)");
  std::vector<void*> resident(1000);
  for (size_t i = 0; i < resident.size(); ++i) {
    Check(cudaMalloc(&resident[i], 256 + (i % 64) * 4096), "cudaMalloc (resident set)");
  }
  char* dev = nullptr;
  Check(cudaMalloc(&dev, bytes), "cudaMalloc (buffer)");
  Check(cudaMemset(dev, 0x5a, bytes), "cudaMemset");
  char* ring[kRing];
  cudaEvent_t done[kRing];
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < kRing; ++i) {
    Check(cudaHostAlloc(reinterpret_cast<void**>(&ring[i]), kChunk, cudaHostAllocDefault),
          "cudaHostAlloc (ring)");
    Check(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  CUdevice cu_dev;
  Check(cuDeviceGet(&cu_dev, 0), "cuDeviceGet");
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t granularity = 0;
  Check(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity");
  CUdeviceptr va = 0;
  Check(cuMemAddressReserve(&va, bytes, granularity, 0, 0), "cuMemAddressReserve");
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  std::printf("way,direction,round,seconds,gib_per_s\n");
  const std::string only = argc > 3 ? argv[3] : "";
  auto Wanted = [&](const std::string& way) { return way.compare(0, only.size(), only) == 0; };
  using Way = std::function<void(int)>;
  std::vector<Way> ways;
  for (bool touched : {false, true}) {  // pageable_fresh, pageable_touched
    const std::string way = touched ? "pageable_touched" : "pageable_fresh";
    if (!Wanted(way)) continue;
    ways.push_back([&, touched, way](int round) {
      char* host = FreshHost(bytes);
      if (touched) std::memset(host, 1, bytes);
      auto t0 = Clock::now();
      Check(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy DtoH");
      Row(way, "to_host", round, Seconds(Clock::now() - t0), bytes);
      t0 = Clock::now();
      Check(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy HtoD");
      Row(way, "to_device", round, Seconds(Clock::now() - t0), bytes);
      FreeHost(host, bytes);
    });
  }
  if (Wanted("pinned_alloc")) ways.push_back([&](int round) {  // pinned_alloc
    auto t0 = Clock::now();
    char* host = nullptr;
    Check(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocDefault),
          "cudaHostAlloc");
    const double alloc = Seconds(Clock::now() - t0);
    Check(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy DtoH");
    Row("pinned_alloc", "to_host", round, Seconds(Clock::now() - t0), bytes);
    Row("pinned_alloc_only_alloc", "to_host", round, alloc, bytes);
    t0 = Clock::now();
    Check(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy HtoD");
    Row("pinned_alloc", "to_device", round, Seconds(Clock::now() - t0), bytes);
    Check(cudaFreeHost(host), "cudaFreeHost");
  });
  if (Wanted("host_register")) ways.push_back([&](int round) {  // host_register
    char* host = FreshHost(bytes);
    auto t0 = Clock::now();
    Check(cudaHostRegister(host, bytes, cudaHostRegisterDefault), "cudaHostRegister");
    Check(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy DtoH");
    Row("host_register", "to_host", round, Seconds(Clock::now() - t0), bytes);
    t0 = Clock::now();
    Check(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy HtoD");
    Row("host_register", "to_device", round, Seconds(Clock::now() - t0), bytes);
    Check(cudaHostUnregister(host), "cudaHostUnregister");
    FreeHost(host, bytes);
  });
  struct Staging {
    int threads;
    bool huge;
  };
  for (Staging st : {Staging{1, false}, Staging{4, false}, Staging{8, false}, Staging{16, false},
                     Staging{8, true}, Staging{16, true}}) {
    const int threads = st.threads;
    const std::string way = "staged_" + std::to_string(threads) + (st.huge ? "_thp" : "");
    if (!Wanted(way)) continue;
    ways.push_back([&, threads, way, st](int round) {  // staged_T
      char* host = FreshHost(bytes, st.huge);
      auto t0 = Clock::now();
      Staged(dev, host, bytes, threads, true, ring, stream, done);
      Row(way, "to_host", round, Seconds(Clock::now() - t0), bytes);
      t0 = Clock::now();
      Staged(dev, host, bytes, threads, false, ring, stream, done);
      Row(way, "to_device", round, Seconds(Clock::now() - t0), bytes);
      FreeHost(host, bytes);
    });
  }
  for (int handles : {1, 64}) {
    if (!Wanted("vmm_")) continue;
    ways.push_back([&, handles](int round) {  // vmm_release / vmm_recreate
      const size_t each = bytes / handles;
      std::vector<CUmemGenericAllocationHandle> h(handles);
      for (int i = 0; i < handles; ++i) {
        Check(cuMemCreate(&h[i], each, &prop, 0), "cuMemCreate");
        Check(cuMemMap(va + i * each, each, 0, h[i], 0), "cuMemMap");
      }
      Check(cuMemSetAccess(va, bytes, &access, 1), "cuMemSetAccess");
      const std::string suffix = "_" + std::to_string(handles);
      auto t0 = Clock::now();
      Check(cuMemUnmap(va, bytes), "cuMemUnmap");
      for (int i = 0; i < handles; ++i) Check(cuMemRelease(h[i]), "cuMemRelease");
      Row("vmm_release" + suffix, "release", round, Seconds(Clock::now() - t0), bytes);
      t0 = Clock::now();
      for (int i = 0; i < handles; ++i) {
        Check(cuMemCreate(&h[i], each, &prop, 0), "cuMemCreate");
        Check(cuMemMap(va + i * each, each, 0, h[i], 0), "cuMemMap");
      }
      Check(cuMemSetAccess(va, bytes, &access, 1), "cuMemSetAccess");
      Row("vmm_recreate" + suffix, "create", round, Seconds(Clock::now() - t0), bytes);
      Check(cuMemUnmap(va, bytes), "cuMemUnmap");
      for (int i = 0; i < handles; ++i) Check(cuMemRelease(h[i]), "cuMemRelease");
    });
  }
  // One warm-up round (not printed), then `rounds` rounds, the ways in a
  // rotated order each round.
  for (int round = -1; round < rounds; ++round) {
    const size_t start = round < 0 ? 0 : static_cast<size_t>(round);
    for (size_t k = 0; k < ways.size(); ++k) ways[(start + k) % ways.size()](round);
  }
  return 0;
}

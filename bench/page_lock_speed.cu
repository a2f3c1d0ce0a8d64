// How fast host memory can be made page-locked, natively, by the ways a
// pause's kept pinned pool (docs/pause-resume.md, "Copy-engine speed") could
// make it, and how fast the copy engine then fills and empties it. The
// earlier measurement (bench/backup_bandwidth.cu) pinned new 4 KiB pages from
// one thread: 2.2-3.0 GiB/s. What is not known is whether the cost is the
// first touch (zeroing), the kernel's pinning of each page, or the driver's,
// and whether threads or huge pages change it.
//
// Each way makes SIZE bytes (default 16 GiB) page-locked, copies a device
// buffer of that size into it and back (cuMemcpyDtoH/HtoD, one call each),
// and gives it back; the ways alternate, ROUNDS rounds (default 2) after one
// warm-up round that is not reported, with a resident set of 1,000 device
// allocations live. Rows:
//   way,step,round,seconds,gib_per_s
// Ways (T = the CPUs the process may use, at most 16):
//   register_fresh       new 4 KiB-page memory, cuMemHostRegister from one thread
//   register_thp         new memory advised MADV_HUGEPAGE, cuMemHostRegister from one thread
//   touch_thp_register   the same, first written by T threads (step "touch"),
//                        then registered from one thread (step "lock")
//   register_thp_T       MADV_HUGEPAGE memory, T threads each touching and
//                        registering 1/T of it (T registrations)
//   chunks_thp_T         MADV_HUGEPAGE memory written by T threads, then
//                        registered as 1 GiB chunks by T threads at once; its
//                        free step also times dropping every registration
//                        (T threads), making them again, and dropping them again
//   host_alloc           cuMemHostAlloc (portable)
//   vmm_host             cuMemCreate of host memory (CU_MEM_LOCATION_TYPE_HOST_NUMA,
//                        node 0) + reserve + map + cuMemSetAccess for the device
// Steps: lock (making it page-locked: the whole way's cost to have it),
// to_host, to_device, free.
// usage: page_lock_speed [SIZE_GIB] [ROUNDS] [WAY,...]
#include <cuda.h>
#include <cuda_runtime.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host_copy_setup.h"

namespace {

using host_copy_setup::Check;
using host_copy_setup::Clock;
using host_copy_setup::Map;
using host_copy_setup::Since;

// `f(from, to)` on `threads` threads over [0, bytes), in 2 MiB-aligned parts.
void Parallel(size_t bytes, int threads, const std::function<void(size_t, size_t)>& f) {
  const size_t align = size_t{2} << 20;
  const size_t part = ((bytes / threads) + align - 1) / align * align;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const size_t from = std::min(bytes, part * t);
    const size_t to = t + 1 == threads ? bytes : std::min(bytes, from + part);
    if (to > from) pool.emplace_back(f, from, to);
  }
  for (std::thread& t : pool) t.join();
}

void Row(const std::string& way, const char* step, int round, double seconds, size_t bytes) {
  if (round < 0) return;  // warm-up
  std::printf("%s,%s,%d,%.4f,%.2f\n", way.c_str(), step, round, seconds,
              bytes / double(size_t{1} << 30) / seconds);
  std::fflush(stdout);
}

// Page-locked memory made one way: `lock` makes it (rows of its own steps
// where it has several), `host` is where it is, `release` gives it back.
struct Locked {
  char* host = nullptr;
  std::function<void()> release;
  bool device_address = false;  // vmm_host: copied with cuMemcpy (unified addressing)
  size_t part = size_t{4} << 30;  // the largest copy that stays in one registration
};

// One copy between `locked` and `device` in parts of at most 4 GiB: one call
// of 16 GiB to registered memory fails with CUDA_ERROR_INVALID_VALUE on the
// H200's driver 580 (8 GiB passes).
bool Copy(const std::string& way, const Locked& locked, CUdeviceptr device, size_t bytes,
          bool to_host) {
  const size_t kPart = locked.part;
  for (size_t off = 0; off < bytes; off += kPart) {
    const size_t n = std::min(kPart, bytes - off);
    char* host = locked.host + off;
    CUresult r;
    if (locked.device_address) {
      const CUdeviceptr h = reinterpret_cast<CUdeviceptr>(host);
      r = to_host ? cuMemcpy(h, device + off, n) : cuMemcpy(device + off, h, n);
    } else {
      r = to_host ? cuMemcpyDtoH(host, device + off, n) : cuMemcpyHtoD(device + off, host, n);
    }
    if (r != CUDA_SUCCESS) {
      const char* name = nullptr;
      cuGetErrorName(r, &name);
      std::fprintf(stderr, "page_lock_speed: %s: copy %s of %zu bytes at offset %zu: %s\n",
                   way.c_str(), to_host ? "to host" : "to device", n, off, name ? name : "?");
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16) << 30;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2;
  const int threads = host_copy_setup::CopyThreads();
  const CUcontext ctx = host_copy_setup::PrimaryContextWithResidentSet();
  CUdeviceptr buffer;
  Check(cuMemAlloc(&buffer, bytes), "cuMemAlloc (buffer)");
  Check(cuMemsetD8(buffer, 0x5a, bytes), "cuMemsetD8");
  std::fprintf(stderr, "page_lock_speed: %zu GiB, %d threads\n", bytes >> 30, threads);
  std::printf("way,step,round,seconds,gib_per_s\n");

  using Way = std::function<Locked(const std::string&, int)>;
  auto register_range = [&](char* p, size_t n) {
    Check(cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister");
  };
  auto unmap_after_unregister = [&](char* p, std::vector<std::pair<size_t, size_t>> parts) {
    return [=] {
      for (auto [from, to] : parts) Check(cuMemHostUnregister(p + from), "cuMemHostUnregister");
      munmap(p, bytes);
    };
  };
  std::vector<std::pair<std::string, Way>> ways = {
      {"register_fresh",
       [&](const std::string& name, int round) {
         const auto t = Clock::now();
         char* p = Map(bytes, false);
         register_range(p, bytes);
         Row(name, "lock", round, Since(t), bytes);
         return Locked{p, unmap_after_unregister(p, {{0, bytes}})};
       }},
      {"register_thp",
       [&](const std::string& name, int round) {
         const auto t = Clock::now();
         char* p = Map(bytes, true);
         register_range(p, bytes);
         Row(name, "lock", round, Since(t), bytes);
         return Locked{p, unmap_after_unregister(p, {{0, bytes}})};
       }},
      {"touch_thp_register",
       [&](const std::string& name, int round) {
         const auto t = Clock::now();
         char* p = Map(bytes, true);
         Parallel(bytes, threads, [&](size_t from, size_t to) { std::memset(p + from, 0, to - from); });
         Row(name, "touch", round, Since(t), bytes);
         const auto t2 = Clock::now();
         register_range(p, bytes);
         Row(name, "register", round, Since(t2), bytes);
         Row(name, "lock", round, Since(t), bytes);
         return Locked{p, unmap_after_unregister(p, {{0, bytes}})};
       }},
      {"register_thp_T",
       [&](const std::string& name, int round) {
         const auto t = Clock::now();
         char* p = Map(bytes, true);
         std::vector<std::pair<size_t, size_t>> parts;
         std::mutex mu;
         Parallel(bytes, threads, [&](size_t from, size_t to) {
           Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
           std::memset(p + from, 0, to - from);
           register_range(p + from, to - from);
           std::lock_guard<std::mutex> l(mu);
           parts.push_back({from, to});
         });
         Row(name, "lock", round, Since(t), bytes);
         return Locked{p, unmap_after_unregister(p, parts)};
       }},
      {"chunks_thp_T",
       // Registrations of 1 GiB made and dropped by T threads at once: what
       // giving the pinning back before a process checkpoint, and taking it
       // again after, would cost (the free step's rows).
       [&](const std::string& name, int round) {
         constexpr size_t kChunk = size_t{1} << 30;
         const auto t = Clock::now();
         char* p = Map(bytes, true);
         Parallel(bytes, threads, [&](size_t from, size_t to) { std::memset(p + from, 0, to - from); });
         Row(name, "touch", round, Since(t), bytes);
         auto each_chunk = [=](const std::function<void(char*)>& f) {
           std::atomic<size_t> next{0};
           std::vector<std::thread> pool;
           for (int i = 0; i < threads; ++i) {
             pool.emplace_back([&] {
               Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
               for (size_t c; (c = next.fetch_add(1)) * kChunk < bytes;) f(p + c * kChunk);
             });
           }
           for (std::thread& th : pool) th.join();
         };
         auto reg = [=](char* c) {
           Check(cuMemHostRegister(c, std::min(kChunk, size_t(p + bytes - c)),
                                   CU_MEMHOSTREGISTER_PORTABLE),
                 "cuMemHostRegister");
         };
         auto unreg = [](char* c) { Check(cuMemHostUnregister(c), "cuMemHostUnregister"); };
         const auto t2 = Clock::now();
         each_chunk(reg);
         Row(name, "register", round, Since(t2), bytes);
         Row(name, "lock", round, Since(t), bytes);
         Locked l{p, [=] {
                    auto t3 = Clock::now();
                    each_chunk(unreg);
                    Row(name, "unregister", round, Since(t3), bytes);
                    t3 = Clock::now();
                    each_chunk(reg);
                    Row(name, "register_again", round, Since(t3), bytes);
                    t3 = Clock::now();
                    each_chunk(unreg);
                    Row(name, "unregister_again", round, Since(t3), bytes);
                    t3 = Clock::now();
                    munmap(p, bytes);
                    Row(name, "munmap", round, Since(t3), bytes);
                  }};
         l.part = kChunk;
         return l;
       }},
      {"host_alloc",
       [&](const std::string& name, int round) {
         const auto t = Clock::now();
         void* p = nullptr;
         Check(cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
         Row(name, "lock", round, Since(t), bytes);
         return Locked{static_cast<char*>(p), [p] { Check(cuMemFreeHost(p), "cuMemFreeHost"); }};
       }},
      {"vmm_host",
       [&](const std::string& name, int round) {
         const auto t = Clock::now();
         CUmemAllocationProp prop{};
         prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
         prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
         prop.location.id = 0;
         size_t granularity = 0;
         Check(cuMemGetAllocationGranularity(&granularity, &prop,
                                             CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
               "cuMemGetAllocationGranularity (host)");
         const size_t size = (bytes + granularity - 1) / granularity * granularity;
         CUmemGenericAllocationHandle handle;
         Check(cuMemCreate(&handle, size, &prop, 0), "cuMemCreate (host)");
         CUdeviceptr va;
         Check(cuMemAddressReserve(&va, size, granularity, 0, 0), "cuMemAddressReserve");
         Check(cuMemMap(va, size, 0, handle, 0), "cuMemMap");
         CUmemAccessDesc access[2] = {};
         access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
         access[0].location.id = 0;
         access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
         access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
         access[1].location.id = 0;
         access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
         Check(cuMemSetAccess(va, size, access, 2), "cuMemSetAccess (host)");
         Row(name, "lock", round, Since(t), bytes);
         return Locked{reinterpret_cast<char*>(va), [=] {
                         Check(cuMemUnmap(va, size), "cuMemUnmap");
                         Check(cuMemAddressFree(va, size), "cuMemAddressFree");
                         Check(cuMemRelease(handle), "cuMemRelease");
                       },
                       true};
       }},
  };
  if (argc > 3) {  // only the ways named (comma-separated)
    const std::string keep = std::string(",") + argv[3] + ",";
    ways.erase(std::remove_if(ways.begin(), ways.end(),
                              [&](const auto& w) {
                                return keep.find("," + w.first + ",") == std::string::npos;
                              }),
               ways.end());
  }
  for (int round = -1; round < rounds; ++round) {
    for (size_t i = 0; i < ways.size(); ++i) {
      // Rotated each round, so that no way always follows the same one.
      const auto& [name, way] = ways[(i + std::max(round, 0)) % ways.size()];
      Locked locked = way(name, round);
      auto t = Clock::now();
      if (Copy(name, locked, buffer, bytes, /*to_host=*/true)) {
        Row(name, "to_host", round, Since(t), bytes);
      }
      t = Clock::now();
      if (Copy(name, locked, buffer, bytes, /*to_host=*/false)) {
        Row(name, "to_device", round, Since(t), bytes);
      }
      t = Clock::now();
      locked.release();
      Row(name, "free", round, Since(t), bytes);
    }
  }
  return 0;
}

// What an addressable pause (docs/pause-resume-design.md, "Paused memory
// stays addressable") costs with the driver alone: host memory made by
// cuMemCreate at a host NUMA location, mapped where device memory was, and
// reached by kernels over the bus. Natively, on device 0, with a resident
// set of 1,000 small allocations live (bench/host_copy_setup.h).
//
// Rows (CSV): what,threads,bytes,seconds,gib_per_s,result
//   attribute        the device's host NUMA id and VMM support (result)
//   granularity      minimum and recommended, host location (bytes)
//   create           SIZE of host memory made as CHUNK handles by `threads`
//                    threads at once (the driver may serialize them)
//   release          the same handles released by `threads` threads
//   create_granules  512 handles of the minimum granularity, by 1 or 16 threads
//   release_granules those released from one thread
//   map_part         cuMemMap of the first half of a handle (result)
//   map_offset       cuMemMap of the second half of a handle (offset != 0):
//                    whether the driver takes it (result)
//   access_span      one cuMemSetAccess over two mappings (result)
//   copy_to_host     cuMemcpyAsync device -> host mapping, SIZE
//   remap            device memory at VA unmapped, the host chunks mapped
//                    there, cuMemSetAccess for the device (SIZE)
//   kernel_read      a kernel reading the host-mapped VA (SIZE)
//   kernel_write     a kernel writing it
//   cpu_read         the CPU reads through the VA after cuMemSetAccess for
//                    the host location (result: words checked wrong)
//   map_access       the host chunks mapped at VA again and given the
//                    device's access, each chunk by one of `threads` threads
//   remap_beside_copy  device memory at VA swapped for the host chunks (as
//                    `remap`) while a copy of SIZE from other device memory
//                    runs on the copy engine (result: whether the copy was
//                    still running when the swap returned, and its seconds):
//                    whether a pause can map block k while block k+1 copies
//   scratch_map      one granule of host memory mapped over SIZE (one
//                    cuMemMap per granule) and one cuMemSetAccess
//   scratch_write    a kernel writing every word of that range (result)
//   unmap_scratch    the scratch mappings unmapped (one call over the range)
//   run_map_each     SIZE as handles of RUN_MIB (a pause of PyTorch's
//                    expandable segments: 20 MiB handles side by side in one
//                    reservation), each mapped and given the device's access
//                    in turn (result: handles)
//   run_map_span     the same handles mapped side by side, then one
//                    cuMemSetAccess over the run (result: the call's code):
//                    whether the access's cost is per call or per mapping
//   run_unmap_span   that run unmapped in one call (result: the call's code)
// usage: host_vmm_costs [SIZE_GIB (default 4)] [CHUNK_MIB (default 512)] [RUN_MIB (default 20)]
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "host_copy_setup.h"

namespace {

using host_copy_setup::Check;
using host_copy_setup::Clock;
using host_copy_setup::Since;

void Row(const char* what, int threads, size_t bytes, double seconds, const std::string& result) {
  std::printf("%s,%d,%zu,%.4f,%.2f,%s\n", what, threads, bytes, seconds,
              seconds > 0 ? static_cast<double>(bytes) / seconds / (1u << 30) : 0.0,
              result.c_str());
  std::fflush(stdout);
}

std::string Name(CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  return name ? name : "?";
}

__global__ void ReadAll(const unsigned long long* p, size_t n, unsigned long long* sum) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    s += p[i];
  }
  if (s == 42) *sum = s;  // keeps the loads
}

__global__ void WriteAll(unsigned long long* p, size_t n, unsigned long long salt) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = i ^ salt;
  }
}

CUmemAllocationProp HostProp(int numa) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = numa;
  return prop;
}

CUmemAccessDesc Access(CUmemLocationType type, int id) {
  CUmemAccessDesc a{};
  a.location.type = type;
  a.location.id = id;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t gib = size_t{1} << 30;
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4) * gib;
  const size_t chunk = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 512) << 20;
  const size_t run_piece = (argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 20) << 20;
  CUcontext ctx = host_copy_setup::PrimaryContextWithResidentSet();
  CUdevice dev;
  Check(cuCtxGetDevice(&dev), "cuCtxGetDevice");
  int numa = -1, supported = 0;
  cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
  cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                       dev);
  std::printf("what,threads,bytes,seconds,gib_per_s,result\n");
  Row("attribute", 0, 0, 0, "numa_id=" + std::to_string(numa) +
                                " vmm_supported=" + std::to_string(supported));
  if (!supported || numa < 0) return 0;
  const CUmemAllocationProp prop = HostProp(numa);
  size_t minimum = 0, recommended = 0;
  Check(cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "gran");
  Check(cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "gran");
  Row("granularity", 0, minimum, 0, "recommended=" + std::to_string(recommended));

  // Creation and release by 1, 4 and 16 threads (after one warm-up of 1 GiB).
  const size_t chunks = bytes / chunk;
  {
    CUmemGenericAllocationHandle h;
    Check(cuMemCreate(&h, gib, &prop, 0), "cuMemCreate (warm-up)");
    Check(cuMemRelease(h), "cuMemRelease (warm-up)");
  }
  std::vector<CUmemGenericAllocationHandle> handles(chunks);
  const int rounds[] = {1, 4, 16, 1, 4, 16};
  for (int i = 0; i < 6; ++i) {
    const int threads = rounds[i];
    auto run = [&](bool create) {
      std::atomic<size_t> next{0};
      std::vector<std::thread> pool;
      const auto t = Clock::now();
      for (int i = 0; i < threads; ++i) {
        pool.emplace_back([&] {
          cuCtxSetCurrent(ctx);
          for (size_t k; (k = next++) < chunks;) {
            if (create) {
              Check(cuMemCreate(&handles[k], chunk, &prop, 0), "cuMemCreate (host)");
            } else {
              Check(cuMemRelease(handles[k]), "cuMemRelease (host)");
            }
          }
        });
      }
      for (auto& th : pool) th.join();
      Row(create ? "create" : "release", threads, bytes, Since(t), "ok");
    };
    run(true);
    if (i == 5) break;  // the last round's handles are used below
    run(false);
  }

  // Small handles (one granule each, as a pause of packed 2 MiB blocks
  // needs): 512 of them by 1 and 16 threads, made then released.
  for (int threads : {1, 16}) {
    std::vector<CUmemGenericAllocationHandle> small(512);
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    const auto t = Clock::now();
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&] {
        for (size_t k; (k = next++) < small.size();) {
          Check(cuMemCreate(&small[k], minimum, &prop, 0), "cuMemCreate (granule)");
        }
      });
    }
    for (auto& th : pool) th.join();
    Row("create_granules", threads, small.size() * minimum, Since(t), "ok");
    const auto r = Clock::now();
    for (auto h : small) Check(cuMemRelease(h), "cuMemRelease (granule)");
    Row("release_granules", 1, small.size() * minimum, Since(r), "ok");
  }

  // A device allocation of SIZE at `va`, filled with a pattern.
  CUdeviceptr va, host_va;
  Check(cuMemAddressReserve(&va, bytes, 0, 0, 0), "reserve");
  Check(cuMemAddressReserve(&host_va, bytes, 0, 0, 0), "reserve (host)");
  CUmemAllocationProp dprop{};
  dprop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  dprop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  dprop.location.id = dev;
  CUmemGenericAllocationHandle device_handle;
  Check(cuMemCreate(&device_handle, bytes, &dprop, 0), "cuMemCreate (device)");
  const CUmemAccessDesc device_rw = Access(CU_MEM_LOCATION_TYPE_DEVICE, dev);
  const CUmemAccessDesc host_rw = Access(CU_MEM_LOCATION_TYPE_HOST_NUMA, numa);
  Check(cuMemMap(va, bytes, 0, device_handle, 0), "map (device)");
  Check(cuMemSetAccess(va, bytes, &device_rw, 1), "access (device)");
  const size_t words = bytes / 8;
  WriteAll<<<1024, 256>>>(reinterpret_cast<unsigned long long*>(va), words, 7);
  Check(cuCtxSynchronize(), "fill");

  {  // a part of a handle, at offset 0 and past it; one access call over two mappings
    CUdeviceptr probe;
    Check(cuMemAddressReserve(&probe, chunk, 0, 0, 0), "reserve (probe)");
    CUresult r = cuMemMap(probe, chunk / 2, 0, handles[0], 0);
    Row("map_part", 0, chunk / 2, 0, Name(r));
    if (r == CUDA_SUCCESS) Check(cuMemUnmap(probe, chunk / 2), "unmap (probe)");
    r = cuMemMap(probe, chunk / 2, chunk / 2, handles[0], 0);
    Row("map_offset", 0, chunk / 2, 0, Name(r));
    if (r == CUDA_SUCCESS) Check(cuMemUnmap(probe, chunk / 2), "unmap (probe)");
    Check(cuMemAddressFree(probe, chunk), "free (probe)");
  }
  // The host chunks at their own VA, for the copies and the CPU.
  auto t = Clock::now();
  for (size_t k = 0; k < chunks; ++k) {
    Check(cuMemMap(host_va + k * chunk, chunk, 0, handles[k], 0), "map (host)");
  }
  CUresult span = cuMemSetAccess(host_va, bytes, &device_rw, 1);
  Row("access_span", 0, bytes, Since(t), Name(span));
  if (span != CUDA_SUCCESS) {
    for (size_t k = 0; k < chunks; ++k) {
      Check(cuMemSetAccess(host_va + k * chunk, chunk, &device_rw, 1), "access (host chunk)");
    }
  }
  Check(cuMemSetAccess(host_va, bytes, &host_rw, 1), "access (host location)");
  CUstream stream;
  Check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
  for (int round = 0; round < 2; ++round) {
    t = Clock::now();
    Check(cuMemcpyAsync(host_va, va, bytes, stream), "copy to host");
    Check(cuStreamSynchronize(stream), "sync");
    Row("copy_to_host", 0, bytes, Since(t), "ok");
  }
  t = Clock::now();
  Check(cuMemUnmap(va, bytes), "unmap (device)");
  for (size_t k = 0; k < chunks; ++k) {
    Check(cuMemMap(va + k * chunk, chunk, 0, handles[k], 0), "map (host at va)");
  }
  Check(cuMemSetAccess(va, bytes, &device_rw, 1), "access (host at va)");
  Row("remap", 0, bytes, Since(t), "ok");
  unsigned long long* sum;
  cudaMalloc(&sum, 8);
  for (int round = 0; round < 2; ++round) {
    t = Clock::now();
    ReadAll<<<1024, 256>>>(reinterpret_cast<unsigned long long*>(va), words, sum);
    Check(cuCtxSynchronize(), "kernel read");
    Row("kernel_read", 0, bytes, Since(t), "ok");
  }
  t = Clock::now();
  WriteAll<<<1024, 256>>>(reinterpret_cast<unsigned long long*>(va), words, 9);
  Check(cuCtxSynchronize(), "kernel write");
  Row("kernel_write", 0, bytes, Since(t), "ok");
  Check(cuMemSetAccess(va, bytes, &host_rw, 1), "access (cpu at va)");
  size_t wrong = 0;
  const auto* cpu = reinterpret_cast<const unsigned long long*>(va);
  for (size_t i = 0; i < words; i += 4099) wrong += cpu[i] != (i ^ 9);
  Row("cpu_read", 0, words / 4099 * 8, 0, "wrong=" + std::to_string(wrong));

  // The remap's host side again, by 1, 4 and 16 threads, each mapping its
  // chunks at VA and giving the device access: whether the driver lets a
  // pause's host mappings run in parallel (cuMemSetAccess on host memory is
  // most of the remap).
  for (int threads : {1, 4, 16, 1}) {
    Check(cuMemUnmap(va, bytes), "unmap (host at va)");
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    const auto start = Clock::now();
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&] {
        cuCtxSetCurrent(ctx);
        for (size_t k; (k = next++) < chunks;) {
          Check(cuMemMap(va + k * chunk, chunk, 0, handles[k], 0), "map (host at va)");
          Check(cuMemSetAccess(va + k * chunk, chunk, &device_rw, 1), "access (host at va)");
        }
      });
    }
    for (auto& th : pool) th.join();
    Row("map_access", threads, bytes, Since(start), "ok");
  }

  // The swap beside a copy: device memory at VA again, a copy of SIZE from
  // other device memory started, then the swap timed. Were the swap to
  // wait for the copy engine, it would return after the copy.
  {
    CUdeviceptr other;
    CUmemGenericAllocationHandle other_handle;
    Check(cuMemAddressReserve(&other, bytes, 0, 0, 0), "reserve (copy source)");
    Check(cuMemCreate(&other_handle, bytes, &dprop, 0), "cuMemCreate (copy source)");
    Check(cuMemMap(other, bytes, 0, other_handle, 0), "map (copy source)");
    Check(cuMemSetAccess(other, bytes, &device_rw, 1), "access (copy source)");
    for (int round = 0; round < 3; ++round) {
      Check(cuMemUnmap(va, bytes), "unmap (host at va)");
      Check(cuMemMap(va, bytes, 0, device_handle, 0), "map (device again)");
      Check(cuMemSetAccess(va, bytes, &device_rw, 1), "access (device again)");
      Check(cuCtxSynchronize(), "idle");
      const auto copy_start = Clock::now();
      Check(cuMemcpyAsync(host_va, other, bytes, stream), "copy beside the swap");
      const auto swap_start = Clock::now();
      Check(cuMemUnmap(va, bytes), "unmap (device, beside a copy)");
      for (size_t k = 0; k < chunks; ++k) {
        Check(cuMemMap(va + k * chunk, chunk, 0, handles[k], 0), "map (host, beside a copy)");
      }
      Check(cuMemSetAccess(va, bytes, &device_rw, 1), "access (host, beside a copy)");
      const double swap = Since(swap_start);
      const CUresult running = cuStreamQuery(stream);
      Check(cuStreamSynchronize(stream), "copy beside the swap (sync)");
      const double copy = Since(copy_start);
      Row("remap_beside_copy", 0, bytes, swap,
          std::string("copy_still_running=") + (running == CUDA_ERROR_NOT_READY ? "yes" : "no") +
              " copy_s=" + std::to_string(copy));
    }
    Check(cuMemUnmap(other, bytes), "unmap (copy source)");
    Check(cuMemRelease(other_handle), "release (copy source)");
    Check(cuMemAddressFree(other, bytes), "free (copy source)");
  }

  // Back to device memory, then a scratch granule over the whole range.
  Check(cuMemUnmap(va, bytes), "unmap (host at va)");
  CUmemGenericAllocationHandle scratch;
  Check(cuMemCreate(&scratch, minimum, &prop, 0), "cuMemCreate (scratch)");
  t = Clock::now();
  for (size_t off = 0; off < bytes; off += minimum) {
    Check(cuMemMap(va + off, minimum, 0, scratch, 0), "map (scratch)");
  }
  Check(cuMemSetAccess(va, bytes, &device_rw, 1), "access (scratch)");
  Row("scratch_map", 0, bytes, Since(t), "granule=" + std::to_string(minimum));
  t = Clock::now();
  WriteAll<<<1024, 256>>>(reinterpret_cast<unsigned long long*>(va), words, 3);
  CUresult wrote = cuCtxSynchronize();
  Row("scratch_write", 0, bytes, Since(t), Name(wrote));
  t = Clock::now();
  CUresult unmapped = cuMemUnmap(va, bytes);
  Row("unmap_scratch", 0, bytes, Since(t), Name(unmapped));
  if (unmapped != CUDA_SUCCESS) {
    for (size_t off = 0; off < bytes; off += minimum) cuMemUnmap(va + off, minimum);
  }
  // A run of handles of RUN_MIB side by side at `va` (rounded to the
  // granularity), given the device's access one by one or in one call over
  // the run; each way twice, alternated, after a warm-up of each.
  {
    const size_t piece = (run_piece + recommended - 1) / recommended * recommended;
    const size_t pieces = bytes / piece;
    std::vector<CUmemGenericAllocationHandle> run(pieces);
    for (auto& h : run) Check(cuMemCreate(&h, piece, &prop, 0), "cuMemCreate (run)");
    const std::string count = std::to_string(pieces) + "x" + std::to_string(piece >> 20) + "MiB";
    for (int round = 0; round < 3; ++round) {
      for (bool span : {false, true}) {
        const auto start = Clock::now();
        CUresult code = CUDA_SUCCESS;
        for (size_t k = 0; k < pieces; ++k) {
          Check(cuMemMap(va + k * piece, piece, 0, run[k], 0), "map (run)");
          if (!span) Check(cuMemSetAccess(va + k * piece, piece, &device_rw, 1), "access (run)");
        }
        if (span) code = cuMemSetAccess(va, pieces * piece, &device_rw, 1);
        const double mapped = Since(start);
        if (code != CUDA_SUCCESS) {  // the run one by one, as run_map_each
          for (size_t k = 0; k < pieces; ++k) {
            Check(cuMemSetAccess(va + k * piece, piece, &device_rw, 1), "access (run piece)");
          }
        }
        if (round > 0) {  // round 0: the warm-up
          Row(span ? "run_map_span" : "run_map_each", 0, pieces * piece, mapped,
              span ? Name(code) : count);
        }
        const auto unmap_start = Clock::now();
        CUresult unmapped_run = cuMemUnmap(va, pieces * piece);
        const double unmapped_s = Since(unmap_start);
        if (round > 0 && span) Row("run_unmap_span", 0, pieces * piece, unmapped_s,
                                   Name(unmapped_run));
        if (unmapped_run != CUDA_SUCCESS) {
          for (size_t k = 0; k < pieces; ++k) {
            Check(cuMemUnmap(va + k * piece, piece), "unmap (run)");
          }
        }
      }
    }
    for (auto h : run) Check(cuMemRelease(h), "release (run)");
  }
  // The host chunks released from one thread, mapped once (threads: above).
  Check(cuMemUnmap(host_va, bytes), "unmap (host)");
  t = Clock::now();
  for (auto h : handles) Check(cuMemRelease(h), "release");
  Row("release", 1, bytes, Since(t), "ok");
  Check(cuMemRelease(scratch), "release (scratch)");
  Check(cuMemRelease(device_handle), "release (device)");
  return 0;
}

// What a pause of PyTorch's expandable segments (20 MiB handles side by
// side in one reservation) costs with the driver alone, when the host
// memory it maps at the paused addresses comes as one handle per paused
// handle or as one handle per group of adjacent ones (docs/performance.md,
// "the expandable pause's host mappings"). Natively, on device 0, with a
// resident set of 1,000 small allocations live (bench/host_copy_setup.h).
//
// Each round is a pause as the shim runs it: every piece's copy to host
// memory started on one stream (an event after each), then piece by piece:
// wait for its copy, unmap it, release its device memory; once a group's
// pieces are all unmapped, its host handle is mapped over them and given
// the device's access, while later pieces still copy. Untimed between
// rounds: the host views unmapped, device memory made and mapped again.
//
// Rows (CSV): what,group_mib,bytes,seconds,gib_per_s,result
//   copy_alone  the same copies with nothing unmapped or mapped (the floor)
//   pause       the pause with host handles of GROUP pieces (result: the
//               seconds spent in host mappings, and when the last copy
//               ended, both from the round's start)
// The groups (1, 4, 12 and 51 pieces) and copy_alone alternate, twice each
// after an uncounted warm-up round of each.
// usage: host_view_groups [SIZE_GIB (default 4)] [PIECE_MIB (default 20)]
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "host_copy_setup.h"

namespace {

using host_copy_setup::Check;
using host_copy_setup::Clock;
using host_copy_setup::Since;

CUmemAccessDesc DeviceAccess(int dev) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

struct Setup {
  int dev = 0;
  CUmemAllocationProp device_prop{};
  CUmemAllocationProp host_prop{};
  size_t piece = 0;
  size_t pieces = 0;
  CUdeviceptr va = 0;  // the "paused" reservation, pieces side by side
  std::vector<CUmemGenericAllocationHandle> device;
  CUstream stream = nullptr;
  std::vector<CUevent> copied;
};

void MapDevice(Setup& s) {
  const CUmemAccessDesc rw = DeviceAccess(s.dev);
  for (size_t k = 0; k < s.pieces; ++k) {
    Check(cuMemCreate(&s.device[k], s.piece, &s.device_prop, 0), "cuMemCreate (device piece)");
    Check(cuMemMap(s.va + k * s.piece, s.piece, 0, s.device[k], 0), "map (device piece)");
    Check(cuMemSetAccess(s.va + k * s.piece, s.piece, &rw, 1), "access (device piece)");
  }
}

// Host memory for the copies: handles of `group` pieces, each mapped at
// `host_va` for the copies (and the device's access there).
struct HostSet {
  size_t group = 0;
  CUdeviceptr host_va = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
};

HostSet MakeHostSet(Setup& s, size_t group) {
  HostSet h;
  h.group = group;
  const size_t bytes = s.piece * group;
  Check(cuMemAddressReserve(&h.host_va, s.piece * s.pieces, 0, 0, 0), "reserve (host)");
  const CUmemAccessDesc rw = DeviceAccess(s.dev);
  for (size_t g = 0; g < s.pieces / group; ++g) {
    CUmemGenericAllocationHandle handle;
    Check(cuMemCreate(&handle, bytes, &s.host_prop, 0), "cuMemCreate (host group)");
    Check(cuMemMap(h.host_va + g * bytes, bytes, 0, handle, 0), "map (host group)");
    Check(cuMemSetAccess(h.host_va + g * bytes, bytes, &rw, 1), "access (host group)");
    h.handles.push_back(handle);
  }
  return h;
}

void StartCopies(Setup& s, CUdeviceptr host_va) {
  for (size_t k = 0; k < s.pieces; ++k) {
    Check(cuMemcpyAsync(host_va + k * s.piece, s.va + k * s.piece, s.piece, s.stream), "copy");
    Check(cuEventRecord(s.copied[k], s.stream), "event");
  }
}

// One pause with `host`'s groups; returns its seconds, with the host
// mappings' share and when the last copy was seen done.
double Pause(Setup& s, HostSet& host, double* mapping, double* copies_done) {
  const CUmemAccessDesc rw = DeviceAccess(s.dev);
  const size_t bytes = s.piece * host.group;
  Check(cuCtxSynchronize(), "idle");
  const auto start = Clock::now();
  StartCopies(s, host.host_va);
  *mapping = 0;
  for (size_t k = 0; k < s.pieces; ++k) {
    Check(cuEventSynchronize(s.copied[k]), "wait (copy)");
    if (k + 1 == s.pieces) *copies_done = Since(start);
    Check(cuMemUnmap(s.va + k * s.piece, s.piece), "unmap (device piece)");
    Check(cuMemRelease(s.device[k]), "release (device piece)");
    if ((k + 1) % host.group != 0) continue;
    const auto m = Clock::now();
    const size_t g = k / host.group;
    Check(cuMemMap(s.va + g * bytes, bytes, 0, host.handles[g], 0), "map (host view)");
    Check(cuMemSetAccess(s.va + g * bytes, bytes, &rw, 1), "access (host view)");
    *mapping += Since(m);
  }
  const double seconds = Since(start);
  // Untimed: the resume's mappings, without its copies.
  Check(cuMemUnmap(s.va, s.piece * s.pieces), "unmap (host views)");
  MapDevice(s);
  return seconds;
}

double CopyAlone(Setup& s, HostSet& host) {
  Check(cuCtxSynchronize(), "idle");
  const auto start = Clock::now();
  StartCopies(s, host.host_va);
  Check(cuStreamSynchronize(s.stream), "copies");
  return Since(start);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t gib = size_t{1} << 30;
  const size_t size = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4) * gib;
  const size_t piece_mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20;
  host_copy_setup::PrimaryContextWithResidentSet();
  Setup s;
  CUdevice dev;
  Check(cuCtxGetDevice(&dev), "cuCtxGetDevice");
  s.dev = dev;
  int numa = -1, supported = 0;
  cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
  cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                       dev);
  std::printf("what,group_mib,bytes,seconds,gib_per_s,result\n");
  if (!supported || numa < 0) {
    std::printf("attribute,0,0,0,0,host_vmm_unsupported\n");
    return 0;
  }
  s.device_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  s.device_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  s.device_prop.location.id = dev;
  s.host_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  s.host_prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  s.host_prop.location.id = numa;
  size_t granularity = 0;
  Check(cuMemGetAllocationGranularity(&granularity, &s.device_prop,
                                      CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "granularity");
  s.piece = ((piece_mib << 20) + granularity - 1) / granularity * granularity;
  // A multiple of 204 pieces (4 GiB of 20 MiB ones), which every group divides.
  const size_t groups[] = {1, 4, 12, 51};
  s.pieces = std::max<size_t>(1, size / s.piece / 204) * 204;
  const size_t bytes = s.piece * s.pieces;
  s.device.resize(s.pieces);
  s.copied.resize(s.pieces);
  for (CUevent& e : s.copied) Check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "event");
  Check(cuStreamCreate(&s.stream, CU_STREAM_NON_BLOCKING), "stream");
  Check(cuMemAddressReserve(&s.va, bytes, 0, 0, 0), "reserve");
  MapDevice(s);
  std::vector<HostSet> sets;
  for (size_t g : groups) sets.push_back(MakeHostSet(s, g));
  for (int round = 0; round < 3; ++round) {  // round 0: the warm-up
    {
      const double seconds = CopyAlone(s, sets[0]);
      if (round > 0) {
        std::printf("copy_alone,%zu,%zu,%.4f,%.2f,ok\n", s.piece >> 20, bytes, seconds,
                    bytes / seconds / gib);
      }
    }
    for (HostSet& h : sets) {
      double mapping = 0, done = 0;
      const double seconds = Pause(s, h, &mapping, &done);
      if (round == 0) continue;
      std::printf("pause,%zu,%zu,%.4f,%.2f,mappings_s=%.4f copies_done_s=%.4f\n",
                  (s.piece * h.group) >> 20, bytes, seconds, bytes / seconds / gib, mapping, done);
      std::fflush(stdout);
    }
  }
  return 0;
}

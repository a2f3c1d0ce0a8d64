// What other libraries' paused handles map while paused (ForeignVmm's part
// of Paused memory stays addressable, core/heap/host_mapped_pool.h): their
// views, made at the pause, made late (Note [Views made late],
// core/heap/pause.h) and taken away at the resume or a free.
#include "core/foreign/foreign_vmm.h"
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include "core/base/log.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/driver/vmm_mapping.h"

namespace vmmshim {

DeviceSet ForeignVmm::DevicesOf(const Mapping& m, CUmemAccess_flags flags) {
  DeviceSet out;
  for (const CUmemAccessDesc& d : m.access) {
    if (d.location.type == CU_MEM_LOCATION_TYPE_DEVICE && d.flags == flags &&
        d.location.id >= 0 && d.location.id < kMaxDevices) {
      out |= DeviceSet::Of(d.location.id);
    }
  }
  return out;
}

void ForeignVmm::MapViewsLocked(HandleValue value, HostMappedPools& views) {
  MapViewsLocked(value, views.For(handles_.at(value).device));
}

void ForeignVmm::MapViewsLocked(HandleValue value, HostMappedPool* pool) {
  Handle& h = handles_.at(value);
  if (h.group != 0) {
    MapGroupViewLocked(h.group, pool);
    return;
  }
  const HostMappedMemory* contents = h.backup ? h.backup->host_mapped() : nullptr;
  if (h.backup && contents == nullptr) return;  // kept elsewhere: faults
  if (pool == nullptr) return;  // no host VMM memory here
  for (auto m : MappingsOfLocked(value)) {
    Mapping& mapping = m->second;
    if (mapping.view.mapped() || mapping.stale) continue;
    const bool whole = mapping.offset == 0 && mapping.size == h.size;
    if (contents != nullptr && !whole) continue;  // part of the handle: faults
    absl::StatusOr<ViewMapping> view = pool->MapView(
        m->first, mapping.size, contents, DevicesOf(mapping, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    if (!view.ok()) {
      Log().warn("device {}: another library's paused memory at {:#x} ({} bytes) is not "
                 "addressable: {}; an access to it faults",
                 h.device, m->first, mapping.size, view.status().ToString());
      continue;
    }
    mapping.view = *view;
    GrantReadersLocked(m->first, mapping.size, mapping, h.device);
  }
}

void ForeignVmm::GrantReadersLocked(CUdeviceptr at, size_t size, const Mapping& m, int device) {
  std::vector<CUmemAccessDesc> readers;
  for (int reader : DevicesOf(m, CU_MEM_ACCESS_FLAGS_PROT_READ) - DeviceSet::Of(device)) {
    CUmemAccessDesc d = {};
    d.location = {CU_MEM_LOCATION_TYPE_DEVICE, reader};
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    readers.push_back(d);
  }
  if (!readers.empty() &&
      driver_.cuMemSetAccess(at, size, readers.data(), readers.size()) != CUDA_SUCCESS) {
    Log().info("another library's paused memory at {:#x}: its read-only peers do not reach "
               "its view",
               at);
  }
}

size_t ForeignVmm::MapLateViews(HostMappedPools& views, const std::atomic<int>& waiting) {
  // Whether paused `h` wants its contents mapped and has a mapping of the
  // whole handle to map them at (one of part of it faults either way).
  auto late = [&](HandleValue value, const Handle& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!h.paused || h.real != 0 || !h.wants_view || !h.backup.has_value() ||
        h.backup->host_mapped() != nullptr) {
      return false;
    }
    for (auto m : MappingsOfLocked(value)) {
      const Mapping& mapping = m->second;
      if (mapping.offset == 0 && mapping.size == h.size && !mapping.stale &&
          !mapping.view.mapped()) {
        return true;
      }
    }
    return false;
  };
  std::vector<HandleValue> chosen;
  std::vector<CUdeviceptr> runs;  // Note [Adjacent handles share one view]
  {
    MutexLock lock(&mu_);
    for (const auto& [value, h] : handles_) {
      if (late(value, h)) chosen.push_back(value);
    }
    for (const auto& [at, g] : groups_) {
      if (LateGroupLocked(g)) runs.push_back(at);
    }
  }
  size_t bytes = 0;
  for (CUdeviceptr at : runs) {
    MutexLock lock(&mu_);
    auto it = groups_.find(at);
    if (it == groups_.end() || !LateGroupLocked(it->second)) continue;
    ViewGroup& g = it->second;
    HostMappedPool* pool = views.For(g.device);
    if (pool == nullptr) continue;
    const LateMove moved = MoveIntoMadeHostMemory(*pool, &g.backup, g.bytes, waiting);
    if (moved == LateMove::kStopped) return bytes;  // a pause or resume first
    if (moved == LateMove::kNoneMade) continue;     // it stays as it is
    MapGroupViewLocked(at, pool);
    if (g.view.mapped()) bytes += g.bytes;
  }
  for (HandleValue value : chosen) {
    MutexLock lock(&mu_);  // one handle at a time: the library's calls go on between them
    auto it = handles_.find(value);
    if (it == handles_.end() || !late(value, it->second)) continue;
    Handle& h = it->second;
    HostMappedPool* pool = views.For(h.device);
    if (pool == nullptr) continue;
    const LateMove moved = MoveIntoMadeHostMemory(*pool, &h.backup, h.size, waiting);
    if (moved == LateMove::kStopped) break;  // a pause or resume first
    if (moved == LateMove::kNoneMade) continue;  // it stays as it is
    MapViewsLocked(value, views);
    for (auto m : MappingsOfLocked(value)) {
      if (m->second.view.kind == PausedView::kContents) {
        bytes += h.size;
        break;
      }
    }
  }
  return bytes;
}

absl::Status ForeignVmm::UnmapPausedLocked(CUdeviceptr at, Mapping& m) {
  if (m.stale) {
    if (CUresult r = driver_.cuMemUnmap(at, m.size); r != CUDA_SUCCESS) {
      return DriverError(r, "cuMemUnmap (after a failed resume)");
    }
    m.stale = false;
  }
  absl::Status s = m.view.Unmap(VmmMapper(driver_), at, m.size);
  if (!s.ok()) {
    Log().warn("unmapping the host memory at another library's paused {:#x} ({} bytes): {}", at,
               m.size, s.ToString());
  }
  return s;
}

}  // namespace vmmshim

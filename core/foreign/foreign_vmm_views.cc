// What other libraries' paused handles map while paused (ForeignVmm's part
// of Paused memory stays addressable, core/heap/host_mapped_pool.h): their
// views, made at the pause, made late (Note [Views made late],
// core/heap/pause.h) and taken away at the resume or a free; and how a
// handle is mapped for its copies and mapped back at the resume.
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
    GrantReadersLocked(m->first, mapping.size, DevicesOf(mapping, CU_MEM_ACCESS_FLAGS_PROT_READ),
                       h.device);
  }
}

void ForeignVmm::GrantReadersLocked(CUdeviceptr at, size_t size, DeviceSet readers_of,
                                    int device) {
  std::vector<CUmemAccessDesc> readers;
  for (int reader : readers_of - DeviceSet::Of(device)) {
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

absl::Status ForeignVmm::MapAllLocked(HandleValue value, HandleValue real) {
  std::vector<std::pair<CUdeviceptr, size_t>> mapped;
  absl::Status status;
  for (auto m : MappingsOfLocked(value)) {
    const Mapping& mapping = m->second;
    CUresult r = driver_.cuMemMap(m->first, mapping.size, mapping.offset, real, 0);
    if (r != CUDA_SUCCESS) {
      status = DriverError(r, "cuMemMap");
      break;
    }
    mapped.emplace_back(m->first, mapping.size);
    if (mapping.access.empty()) continue;
    r = driver_.cuMemSetAccess(m->first, mapping.size, mapping.access.data(),
                               mapping.access.size());
    if (r == CUDA_SUCCESS) continue;
    // One at a time: a peer the driver refuses now (its access was
    // disabled meanwhile) loses its access, logged; the owner's must hold.
    for (const CUmemAccessDesc& d : mapping.access) {
      r = driver_.cuMemSetAccess(m->first, mapping.size, &d, 1);
      if (r == CUDA_SUCCESS) continue;
      if (d.location.id == handles_.at(value).device) break;
      Log().warn("vmmshim_resume_memory: access of device {} to {:#x} ({} bytes, another "
                 "library's VMM memory) not set again: {}",
                 d.location.id, m->first, mapping.size, CuResultName(r));
      r = CUDA_SUCCESS;
    }
    if (r != CUDA_SUCCESS) {
      status = DriverError(r, "cuMemSetAccess");
      break;
    }
  }
  if (!status.ok()) {
    for (const auto& [at, size] : mapped) driver_.cuMemUnmap(at, size);
  }
  return status;
}

absl::Status ForeignVmm::WithWholeHandleLocked(
    HandleValue value, HandleValue real,
    const std::function<absl::Status(CUdeviceptr, bool)>& fn) {
  const Handle& h = handles_.at(value);
  for (auto m : MappingsOfLocked(value)) {
    const bool readable = std::any_of(
        m->second.access.begin(), m->second.access.end(), [&](const CUmemAccessDesc& d) {
          return d.location.id == h.device && d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE;
        });
    if (m->second.offset == 0 && m->second.size == h.size && readable) {
      return fn(m->first, /*temporary=*/false);
    }
  }
  // No mapping shows it whole: a reservation of the shim's for the call,
  // accessible to the handle's device (CUDA Programming Guide 4.16).
  CUdeviceptr va = 0;
  if (CUresult r = driver_.cuMemAddressReserve(&va, h.size, 0, 0, 0); r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemAddressReserve");
  }
  absl::Status status;
  CUresult r = driver_.cuMemMap(va, h.size, 0, real, 0);
  if (r != CUDA_SUCCESS) {
    status = DriverError(r, "cuMemMap");
  } else {
    CUmemAccessDesc owner = {};
    owner.location = {CU_MEM_LOCATION_TYPE_DEVICE, h.device};
    owner.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = driver_.cuMemSetAccess(va, h.size, &owner, 1);
    status = r == CUDA_SUCCESS ? fn(va, /*temporary=*/true) : DriverError(r, "cuMemSetAccess");
    if (CUresult u = driver_.cuMemUnmap(va, h.size); u != CUDA_SUCCESS) {
      // Still mapped: the reservation stays with it (its handle's memory
      // lives on through the mapping); reported with the copy's status.
      status.Update(DriverError(u, "cuMemUnmap"));
      return status;
    }
  }
  driver_.cuMemAddressFree(va, h.size);
  return status;
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

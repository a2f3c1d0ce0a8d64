#include "core/foreign/foreign_vmm.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/base/log.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"

namespace vmmshim {
namespace {

// The current context when it is on `device` (where the library's work on
// its memory runs), else nullptr.
CUcontext ContextOn(const DriverApi& driver, int device) {
  CUcontext context = nullptr;
  int current = -1;
  if (device < 0 || !CurrentContext(driver, &context, &current) || current != device) {
    return nullptr;
  }
  return context;
}

// Records `desc` as the access of a mapping: the last flags per location.
void RecordAccess(std::vector<CUmemAccessDesc>* access, const CUmemAccessDesc* desc,
                  size_t count) {
  for (size_t i = 0; i < count; ++i) {
    auto same = std::find_if(access->begin(), access->end(), [&](const CUmemAccessDesc& a) {
      return a.location.type == desc[i].location.type && a.location.id == desc[i].location.id;
    });
    if (same == access->end()) {
      access->push_back(desc[i]);
    } else {
      same->flags = desc[i].flags;
    }
  }
}

CUresult PausedHandleError(const char* call, CUmemGenericAllocationHandle value) {
  Log().warn("{} of handle {:#x}: its memory is paused (vmmshim_pause_memory); resume it first",
             call, value);
  return CUDA_ERROR_ILLEGAL_STATE;
}

}  // namespace

ForeignVmm::HandleValue ForeignVmm::NameLocked(HandleValue real) {
  auto it = handles_.find(real);
  if (it == handles_.end() || it->second.real == real) return real;
  // A library holds this value for a paused or resumed handle.
  HandleValue name;
  do {
    name = next_name_--;
  } while (handles_.contains(name) || name == real);
  names_[real] = name;
  return name;
}

ForeignVmm::Handle* ForeignVmm::PausedLocked(HandleValue value) {
  auto it = handles_.find(value);
  return it != handles_.end() && it->second.real == 0 ? &it->second : nullptr;
}

ForeignVmm::HandleValue ForeignVmm::RealLocked(HandleValue value) const {
  auto it = handles_.find(value);
  return it == handles_.end() ? value : it->second.real;
}

absl::btree_map<CUdeviceptr, ForeignVmm::Mapping>::iterator ForeignVmm::MappingAtLocked(
    CUdeviceptr ptr) {
  auto m = mappings_.upper_bound(ptr);
  if (m == mappings_.begin()) return mappings_.end();
  --m;
  return ptr < m->first + m->second.size ? m : mappings_.end();
}

bool ForeignVmm::PausedOverlapLocked(CUdeviceptr ptr, size_t size) {
  auto m = MappingAtLocked(ptr);
  if (m == mappings_.end()) m = mappings_.lower_bound(ptr);
  for (; m != mappings_.end() && m->first < ptr + size; ++m) {
    if (PausedLocked(m->second.handle) != nullptr) return true;
  }
  return false;
}

CUcontext ForeignVmm::ContextForLocked(const Handle& h) const {
  return h.context != nullptr ? h.context : ActivePrimaryContext(driver_, h.device);
}

void ForeignVmm::ForgetMappingLocked(absl::btree_map<CUdeviceptr, Mapping>::iterator m) {
  auto h = handles_.find(m->second.handle);
  mappings_.erase(m);
  if (h == handles_.end()) return;
  --h->second.mappings;
  MaybeForgetLocked(h);
}

void ForeignVmm::MaybeForgetLocked(HandleMap::iterator it) {
  if (it->second.references > 0 || it->second.mappings > 0) return;
  if (it->second.real != 0) {
    if (auto n = names_.find(it->second.real); n != names_.end() && n->second == it->first) {
      names_.erase(n);
    }
  }
  // Gone from its run (its range stays in the run's view: Note [Adjacent
  // handles share one view]).
  if (auto g = groups_.find(it->second.group); it->second.group != 0 && g != groups_.end()) {
    std::vector<HandleValue>& members = g->second.members;
    members.erase(std::remove(members.begin(), members.end(), it->first), members.end());
  }
  handles_.erase(it);
}

CUresult ForeignVmm::Create(CUmemGenericAllocationHandle* handle, size_t size,
                            const CUmemAllocationProp* prop, unsigned long long flags,
                            absl::string_view tag) {
  MutexLock lock(&mu_);
  HandleValue real = 0;
  const CUresult r = driver_.cuMemCreate(handle != nullptr ? &real : nullptr, size, prop, flags);
  if (r != CUDA_SUCCESS) return r;
  const HandleValue value = NameLocked(real);
  Handle h;
  h.real = real;
  h.size = size;
  h.prop = *prop;
  h.device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
  h.tag = std::string(tag);
  h.context = ContextOn(driver_, h.device);
  handles_[value] = std::move(h);  // a value the driver reuses starts over
  *handle = value;
  return CUDA_SUCCESS;
}

CUresult ForeignVmm::Import(CUmemGenericAllocationHandle* handle, void* os_handle,
                            CUmemAllocationHandleType type) {
  MutexLock lock(&mu_);
  if (driver_.cuMemImportFromShareableHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  HandleValue real = 0;
  const CUresult r =
      driver_.cuMemImportFromShareableHandle(handle != nullptr ? &real : nullptr, os_handle, type);
  if (r != CUDA_SUCCESS) return r;
  // The driver may answer with a handle this process holds already (its
  // own export imported back): one more reference of it.
  HandleValue held = real;
  if (auto n = names_.find(real); n != names_.end()) held = n->second;
  if (auto it = handles_.find(held); it != handles_.end() && it->second.real == real) {
    ++it->second.references;
    *handle = held;
    return CUDA_SUCCESS;
  }
  const HandleValue value = NameLocked(real);
  Handle h;
  h.real = real;
  h.imported = true;
  // Its device, for the report; a driver that cannot say leaves it uncounted.
  if (driver_.cuMemGetAllocationPropertiesFromHandle != nullptr &&
      driver_.cuMemGetAllocationPropertiesFromHandle(&h.prop, real) == CUDA_SUCCESS &&
      h.prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    h.device = h.prop.location.id;
  }
  handles_[value] = std::move(h);
  *handle = value;
  return CUDA_SUCCESS;
}

CUresult ForeignVmm::Release(CUmemGenericAllocationHandle value) {
  MutexLock lock(&mu_);
  auto it = handles_.find(value);
  if (it == handles_.end()) return driver_.cuMemRelease(value);
  Handle& h = it->second;
  if (h.real != 0 && !h.one_driver_reference) {
    const CUresult r = driver_.cuMemRelease(h.real);
    if (r != CUDA_SUCCESS) return r;
  } else {
    // Paused (no driver handle), or the driver holds one reference for all
    // of the library's: the driver's goes with the last of them.
    if (h.references <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (h.real != 0 && h.references == 1) {
      const CUresult r = driver_.cuMemRelease(h.real);
      if (r != CUDA_SUCCESS) return r;
    }
  }
  --h.references;
  MaybeForgetLocked(it);
  return CUDA_SUCCESS;
}

CUresult ForeignVmm::Retain(CUmemGenericAllocationHandle* handle, void* addr) {
  MutexLock lock(&mu_);
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (auto m = MappingAtLocked(reinterpret_cast<CUdeviceptr>(addr)); m != mappings_.end()) {
    if (Handle* h = PausedLocked(m->second.handle)) {
      ++h->references;
      *handle = m->second.handle;
      return CUDA_SUCCESS;
    }
  }
  if (driver_.cuMemRetainAllocationHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  HandleValue real = 0;
  const CUresult r = driver_.cuMemRetainAllocationHandle(&real, addr);
  if (r != CUDA_SUCCESS) return r;
  HandleValue value = real;
  if (auto n = names_.find(real); n != names_.end()) value = n->second;
  auto it = handles_.find(value);
  if (it != handles_.end() && it->second.real == real) {
    Handle& h = it->second;
    // One driver reference for all of the library's: the retain's extra one
    // goes back, unless the library had none left.
    if (h.one_driver_reference && h.references > 0) driver_.cuMemRelease(real);
    ++h.references;
  } else if (it != handles_.end()) {
    // Not a handle made here (the shim's own memory, or made before it
    // loaded) whose value a library holds for another handle: a new name,
    // recorded so that its release reaches the driver's handle.
    value = NameLocked(real);
    Handle alias;
    alias.real = real;
    handles_[value] = std::move(alias);
  }
  *handle = value;
  return CUDA_SUCCESS;
}

CUresult ForeignVmm::Map(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle value, unsigned long long flags) {
  MutexLock lock(&mu_);
  // The range of a paused mapping is empty in the driver; natively it is
  // mapped, and mapping over it fails.
  if (PausedOverlapLocked(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  auto it = handles_.find(value);
  if (it != handles_.end() && it->second.real == 0) return PausedHandleError("cuMemMap", value);
  // Into a run's view where the library unmapped one of it: the run comes
  // apart first (Note [Adjacent handles share one view]).
  for (CUdeviceptr run : GroupsOverlappingLocked(ptr, size)) {
    if (absl::Status s = DissolveGroupLocked(run); !s.ok()) return ToCuResult(s);
  }
  const CUresult r =
      driver_.cuMemMap(ptr, size, offset, it != handles_.end() ? it->second.real : value, flags);
  if (r != CUDA_SUCCESS) return r;
  // Recorded even for a handle not made here (made before the shim loaded,
  // or retained from the shim's memory), so that an unmap of a range that
  // also holds paused mappings reaches it.
  if (it != handles_.end()) {
    Handle& h = it->second;
    ++h.mappings;
    if (h.imported) h.size = std::max(h.size, offset + size);  // what is mapped of it
    if (h.context == nullptr) h.context = ContextOn(driver_, h.device);
  }
  Mapping m;
  m.size = size;
  m.offset = offset;
  m.handle = value;
  mappings_[ptr] = std::move(m);
  return CUDA_SUCCESS;
}

CUresult ForeignVmm::Unmap(CUdeviceptr ptr, size_t size) {
  MutexLock lock(&mu_);
  // Every recorded mapping that starts inside [ptr, ptr + size): cuMemUnmap
  // takes whole mappings (a range covering several is allowed).
  std::vector<CUdeviceptr> inside;
  bool any_paused = false;
  for (auto m = mappings_.lower_bound(ptr); m != mappings_.end() && m->first - ptr < size; ++m) {
    inside.push_back(m->first);
    any_paused |= PausedLocked(m->second.handle) != nullptr;
  }
  if (!any_paused) {
    const CUresult r = driver_.cuMemUnmap(ptr, size);
    if (r != CUDA_SUCCESS) return r;
    for (CUdeviceptr at : inside) ForgetMappingLocked(mappings_.find(at));
    return CUDA_SUCCESS;
  }
  // Paused mappings have nothing of the library's in the driver to unmap
  // (their views go; a run's view stays: Note [Adjacent handles share one
  // view]): the live ones, one by one.
  CUresult first = CUDA_SUCCESS;
  for (CUdeviceptr at : inside) {
    auto m = mappings_.find(at);
    const CUresult r = PausedLocked(m->second.handle) == nullptr
                           ? driver_.cuMemUnmap(at, m->second.size)
                           : ToCuResult(UnmapPausedLocked(at, m->second));
    if (r != CUDA_SUCCESS) {
      if (first == CUDA_SUCCESS) first = r;
      continue;
    }
    ForgetMappingLocked(m);
  }
  return first;
}

CUresult ForeignVmm::SetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                               size_t count) {
  MutexLock lock(&mu_);
  // The recorded mappings that overlap [ptr, ptr + size).
  std::vector<CUdeviceptr> overlap;
  bool any_paused = false;
  auto m = MappingAtLocked(ptr);
  if (m == mappings_.end()) m = mappings_.lower_bound(ptr);
  for (; m != mappings_.end() && m->first < ptr + size; ++m) {
    overlap.push_back(m->first);
    any_paused |= PausedLocked(m->second.handle) != nullptr;
  }
  if (!any_paused) {
    const CUresult r = driver_.cuMemSetAccess(ptr, size, desc, count);
    if (r != CUDA_SUCCESS) return r;
    for (CUdeviceptr at : overlap) RecordAccess(&mappings_.at(at).access, desc, count);
    return CUDA_SUCCESS;
  }
  // Paused mappings keep the descriptors for resume, checked as the driver
  // would check them (a descriptor it refuses would make the resume fail);
  // the live ones get them now, each over its part of the range.
  if (CUresult r = CheckAccess(desc, count); r != CUDA_SUCCESS) return r;
  for (CUdeviceptr at : overlap) {  // as in Unmap
    const Handle* h = PausedLocked(mappings_.at(at).handle);
    if (h == nullptr || h->group == 0) continue;
    if (absl::Status s = DissolveGroupLocked(h->group); !s.ok()) return ToCuResult(s);
  }
  CUresult first = CUDA_SUCCESS;
  for (CUdeviceptr at : overlap) {
    Mapping& mapping = mappings_.at(at);
    const CUdeviceptr begin = std::max(at, ptr);
    const CUdeviceptr end = std::min(at + mapping.size, ptr + size);
    if (PausedLocked(mapping.handle) == nullptr) {
      const CUresult r = driver_.cuMemSetAccess(begin, end - begin, desc, count);
      if (r != CUDA_SUCCESS) {
        if (first == CUDA_SUCCESS) first = r;
        continue;
      }
    } else if (mapping.view.mapped()) {
      // The view follows where the driver lets it (host memory may refuse a
      // peer); the device memory gets the descriptors at resume either way.
      if (CUresult r = driver_.cuMemSetAccess(begin, end - begin, desc, count);
          r != CUDA_SUCCESS) {
        Log().info("another library's paused memory at {:#x}: its view keeps its access ({})",
                   begin, static_cast<int>(r));
      }
    }
    RecordAccess(&mapping.access, desc, count);
  }
  return first;
}

CUresult ForeignVmm::GetProperties(CUmemAllocationProp* prop,
                                   CUmemGenericAllocationHandle value) {
  MutexLock lock(&mu_);
  if (PausedLocked(value) != nullptr) {
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *prop = handles_.at(value).prop;
    return CUDA_SUCCESS;
  }
  if (driver_.cuMemGetAllocationPropertiesFromHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return driver_.cuMemGetAllocationPropertiesFromHandle(prop, RealLocked(value));
}

CUresult ForeignVmm::Export(void* shareable, CUmemGenericAllocationHandle value,
                            CUmemAllocationHandleType type, unsigned long long flags) {
  MutexLock lock(&mu_);
  if (driver_.cuMemExportToShareableHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (PausedLocked(value) != nullptr) {
    return PausedHandleError("cuMemExportToShareableHandle", value);
  }
  const CUresult r =
      driver_.cuMemExportToShareableHandle(shareable, RealLocked(value), type, flags);
  if (r != CUDA_SUCCESS) return r;
  if (auto it = handles_.find(value); it != handles_.end()) it->second.exported = true;
  return CUDA_SUCCESS;
}

std::vector<ForeignDeviceFigures> ForeignVmm::Figures() const {
  std::map<int, ForeignDeviceFigures> by_device;
  MutexLock lock(&mu_);
  for (const auto& [value, h] : handles_) {
    if (h.device < 0 || (h.imported && h.mappings == 0)) continue;
    ForeignDeviceFigures& f = by_device[h.device];
    f.device = h.device;
    ++f.handles;
    if (h.paused) {
      f.paused_by_tag[h.tag] += h.size;
    } else if (h.imported) {
      f.imported_bytes += h.size;
    } else {
      f.by_tag[h.tag] += h.size;
      if (h.exported) f.exported_bytes += h.size;
      if (h.mappings == 0) f.unmapped_bytes += h.size;
    }
  }
  for (const auto& [at, m] : mappings_) {
    auto h = handles_.find(m.handle);
    // A stale mapping still maps the memory of a failed resume: not faulting.
    if (h == handles_.end() || !h->second.paused || ShownLocked(h->second, m) || m.stale) continue;
    by_device[h->second.device].paused_faulting_bytes += m.size;
  }
  std::vector<ForeignDeviceFigures> out;
  for (auto& [device, f] : by_device) out.push_back(std::move(f));
  return out;
}

CUresult ForeignVmm::CheckAccess(const CUmemAccessDesc* desc, size_t count) const {
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  int devices = 0;
  if (driver_.cuDeviceGetCount(&devices) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || desc[i].location.id >= devices) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace vmmshim

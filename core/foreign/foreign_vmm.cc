#include "core/foreign/foreign_vmm.h"

#include <algorithm>
#include <string>

namespace vmmshim {

void ForeignVmm::Created(CUmemGenericAllocationHandle handle, size_t size,
                         const CUmemAllocationProp& prop, absl::string_view tag) {
  Handle h;
  h.size = size;
  h.device = prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop.location.id : -1;
  h.tag = std::string(tag);
  MutexLock lock(&mu_);
  handles_[handle] = std::move(h);  // a value the driver reuses starts over
}

void ForeignVmm::Imported(CUmemGenericAllocationHandle handle, const CUmemAllocationProp* prop) {
  Handle h;
  h.imported = true;
  if (prop != nullptr && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    h.device = prop->location.id;
  }
  MutexLock lock(&mu_);
  handles_[handle] = std::move(h);
}

void ForeignVmm::Retained(CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  if (auto it = handles_.find(handle); it != handles_.end()) ++it->second.references;
}

void ForeignVmm::Released(CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return;
  --it->second.references;
  MaybeForgetLocked(it);
}

void ForeignVmm::Exported(CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  if (auto it = handles_.find(handle); it != handles_.end()) it->second.exported = true;
}

void ForeignVmm::Mapped(CUdeviceptr ptr, size_t size, CUmemGenericAllocationHandle handle) {
  MutexLock lock(&mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return;  // made before the shim loaded, or by the shim itself
  Handle& h = it->second;
  ++h.mappings;
  if (h.imported) h.size = std::max(h.size, size);  // its size is what is mapped of it
  mappings_[ptr] = Mapping{size, handle};
}

void ForeignVmm::Unmapped(CUdeviceptr ptr, size_t size) {
  MutexLock lock(&mu_);
  // Every mapping that starts inside [ptr, ptr + size): cuMemUnmap takes
  // whole mappings (a range covering several is allowed).
  for (auto m = mappings_.lower_bound(ptr); m != mappings_.end() && m->first < ptr + size;) {
    auto h = handles_.find(m->second.handle);
    m = mappings_.erase(m);
    if (h == handles_.end()) continue;
    --h->second.mappings;
    MaybeForgetLocked(h);
  }
}

void ForeignVmm::MaybeForgetLocked(
    absl::flat_hash_map<CUmemGenericAllocationHandle, Handle>::iterator it) {
  if (it->second.references <= 0 && it->second.mappings <= 0) handles_.erase(it);
}

std::vector<ForeignDeviceFigures> ForeignVmm::Figures() const {
  std::map<int, ForeignDeviceFigures> by_device;
  MutexLock lock(&mu_);
  for (const auto& [value, h] : handles_) {
    if (h.device < 0 || (h.imported && h.mappings == 0)) continue;
    ForeignDeviceFigures& f = by_device[h.device];
    f.device = h.device;
    ++f.handles;
    if (h.imported) {
      f.imported_bytes += h.size;
    } else {
      f.by_tag[h.tag] += h.size;
      if (h.exported) f.exported_bytes += h.size;
    }
  }
  std::vector<ForeignDeviceFigures> out;
  for (auto& [device, f] : by_device) out.push_back(std::move(f));
  return out;
}

}  // namespace vmmshim

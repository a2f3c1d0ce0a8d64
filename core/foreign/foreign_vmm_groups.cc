// Runs of other libraries' adjacent handles that a pause keeps in one host
// allocation and shows through one view: Note [Adjacent handles share one
// view] (core/foreign/foreign_vmm.h). How they are formed, mapped, unmapped
// and taken apart; the pause and resume steps that use them are in
// foreign_vmm_pause.cc.
#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "core/base/log.h"
#include "core/driver/cu_status.h"
#include "core/driver/vmm_mapping.h"
#include "core/foreign/foreign_vmm.h"

namespace vmmshim {

std::vector<CUdeviceptr> ForeignVmm::FormGroupsLocked(const std::vector<HandleValue>& chosen) {
  // The chosen handles mapped once, whole, from offset 0, readable by their
  // device (the run's copy reads their mappings), by address.
  std::map<CUdeviceptr, HandleValue> by_address;
  for (HandleValue value : chosen) {
    const Handle& h = handles_.at(value);
    const auto mappings = MappingsOfLocked(value);
    if (mappings.size() != 1) continue;
    const Mapping& m = mappings[0]->second;
    const bool readable = (DevicesOf(m, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) |
                           DevicesOf(m, CU_MEM_ACCESS_FLAGS_PROT_READ))
                              .Contains(h.device);
    if (m.offset == 0 && m.size == h.size && !m.stale && readable && h.group == 0 &&
        ReservationOfLocked(mappings[0]->first, m.size) != 0) {
      by_address[mappings[0]->first] = value;
    }
  }
  std::vector<CUdeviceptr> formed;
  std::vector<std::pair<CUdeviceptr, HandleValue>> run;
  size_t run_bytes = 0;
  auto close = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Never over a run left without a view (ViewGroup::broken) at that start.
    if (run.size() >= 2 && !groups_.contains(run.front().first)) {
      const CUdeviceptr start = run.front().first;
      ViewGroup& g = groups_[start];
      g.device = handles_.at(run.front().second).device;
      g.bytes = run_bytes;
      const Mapping& m = mappings_.at(start);
      g.writers = DevicesOf(m, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
      g.readers = DevicesOf(m, CU_MEM_ACCESS_FLAGS_PROT_READ);
      for (const auto& [at, value] : run) {
        Handle& h = handles_.at(value);
        h.group = start;
        h.group_offset = at - start;
        g.members.push_back(value);
      }
      formed.push_back(start);
    }
    run.clear();
    run_bytes = 0;
  };
  for (const auto& [at, value] : by_address) {
    const Handle& h = handles_.at(value);
    if (!run.empty()) {
      const auto& [last_at, last] = run.back();
      const Handle& p = handles_.at(last);
      const Mapping& pm = mappings_.at(last_at);
      const Mapping& m = mappings_.at(at);
      const bool joins =
          last_at + p.size == at && p.device == h.device && p.tag == h.tag &&
          ReservationOfLocked(last_at, p.size) == ReservationOfLocked(at, h.size) &&
          ContextForLocked(p) == ContextForLocked(h) &&
          DevicesOf(pm, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) ==
              DevicesOf(m, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) &&
          DevicesOf(pm, CU_MEM_ACCESS_FLAGS_PROT_READ) ==
              DevicesOf(m, CU_MEM_ACCESS_FLAGS_PROT_READ) &&
          run_bytes + h.size <= kViewGroupBytes;
      if (!joins) close();
    }
    run.emplace_back(at, value);
    run_bytes += h.size;
  }
  close();
  return formed;
}

void ForeignVmm::EraseGroupLocked(CUdeviceptr start) {
  auto it = groups_.find(start);
  if (it == groups_.end()) return;
  // Its view, where it is still mapped (the library unmapped and released
  // every member), goes first; one that will not unmap keeps its memory.
  if (!UnmapGroupViewLocked(start).ok() && it->second.backup) it->second.backup->Abandon();
  for (HandleValue value : it->second.members) {
    auto h = handles_.find(value);
    if (h == handles_.end() || h->second.group != start) continue;
    h->second.group = 0;
    h->second.group_offset = 0;
  }
  groups_.erase(it);
}

bool ForeignVmm::MembersViewableLocked(const ViewGroup& g) const {
  return std::all_of(g.members.begin(), g.members.end(),
                     [&](HandleValue value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Handle& h = handles_.at(value);
    // A resume under way, or a pause without views.
    if (!h.paused || h.real != 0 || !h.wants_view) return false;
    for (const auto& [at, m] : mappings_) {
      if (m.handle == value && m.stale) return false;  // still mapped to a failed resume's memory
    }
    return true;
  });
}

bool ForeignVmm::LateGroupLocked(const ViewGroup& g) const {
  return !g.broken && g.backup.has_value() && g.backup->host_mapped() == nullptr &&
         !g.view.mapped() && MembersViewableLocked(g);
}

std::vector<CUdeviceptr> ForeignVmm::GroupsOverlappingLocked(CUdeviceptr ptr, size_t size) const {
  std::vector<CUdeviceptr> out;
  auto g = groups_.upper_bound(ptr);
  if (g != groups_.begin()) --g;
  for (; g != groups_.end() && g->first < ptr + size; ++g) {
    if (g->first + g->second.bytes > ptr) out.push_back(g->first);
  }
  return out;
}

void ForeignVmm::MapGroupViewLocked(CUdeviceptr start, HostMappedPool* pool) {
  auto it = groups_.find(start);
  if (it == groups_.end() || pool == nullptr) return;
  ViewGroup& g = it->second;
  g.pool = pool;
  if (g.broken || g.view.mapped() || !g.backup.has_value() ||
      g.backup->host_mapped() == nullptr || !MembersViewableLocked(g)) {
    return;
  }
  absl::StatusOr<ViewMapping> view =
      pool->MapView(start, g.bytes, g.backup->host_mapped(), g.writers);
  if (!view.ok()) {
    Log().warn("device {}: other libraries' paused memory at {:#x} ({} bytes, {} handles) is "
               "not addressable: {}; an access to it faults",
               g.device, start, g.bytes, g.members.size(), view.status().ToString());
    return;
  }
  g.view = *view;
  GrantReadersLocked(start, g.bytes, g.readers, g.device);
}

absl::Status ForeignVmm::UnmapGroupViewLocked(CUdeviceptr start) {
  auto it = groups_.find(start);
  if (it == groups_.end()) return absl::OkStatus();
  absl::Status s = it->second.view.Unmap(VmmMapper(driver_), start, it->second.bytes);
  if (!s.ok()) {
    Log().warn("unmapping the host memory at other libraries' paused {:#x} ({} bytes): {}", start,
               it->second.bytes, s.ToString());
  }
  return s;
}

absl::Status ForeignVmm::DissolveGroupLocked(CUdeviceptr start) {
  auto it = groups_.find(start);
  if (it == groups_.end()) return absl::OkStatus();
  ViewGroup& g = it->second;
  // Each paused member's contents into memory of its own, while the run's
  // view still shows them.
  std::vector<std::pair<HandleValue, HostBackup>> own;
  for (HandleValue value : g.members) {
    const Handle& h = handles_.at(value);
    if (!g.backup.has_value() || !h.paused || h.real != 0) continue;
    HostBackup backup;
    if (g.pool != nullptr) {
      absl::StatusOr<HostMappedMemory> memory = g.pool->TakeKept(h.size);
      if (!memory.ok()) memory = HostMappedMemory::Create(driver_, g.pool->node(), g.device, h.size);
      if (memory.ok()) backup = HostBackup::FromHostMapped(*std::move(memory), *g.pool);
    }
    if (backup.data() == nullptr) {
      absl::StatusOr<HostBackup> pageable = HostBackup::Create(h.size);
      if (!pageable.ok()) {
        // No host memory for them: the contents stay in the run, shown by
        // nothing (an access faults) until the resume.
        if (absl::Status s = UnmapGroupViewLocked(start); !s.ok()) return s;
        g.broken = true;
        Log().warn("device {}: other libraries' paused memory at {:#x} ({} bytes): {}; an "
                   "access to it faults until its resume",
                   g.device, start, g.bytes, pageable.status().ToString());
        return absl::OkStatus();
      }
      backup = *std::move(pageable);
    }
    std::memcpy(backup.data(), g.backup->data() + h.group_offset, h.size);
    own.emplace_back(value, std::move(backup));
  }
  if (absl::Status s = UnmapGroupViewLocked(start); !s.ok()) return s;
  for (auto& [value, backup] : own) handles_.at(value).backup = std::move(backup);
  HostMappedPool* pool = g.pool;
  const std::vector<HandleValue> members = g.members;
  EraseGroupLocked(start);  // its memory back to its pool
  for (HandleValue value : members) {
    const Handle& h = handles_.at(value);
    if (h.paused && h.real == 0 && h.wants_view) MapViewsLocked(value, pool);
  }
  return absl::OkStatus();
}

CUdeviceptr ForeignVmm::ReservationOfLocked(CUdeviceptr at, size_t size) const {
  auto r = reservations_.upper_bound(at);
  if (r == reservations_.begin()) return 0;
  --r;
  return at + size <= r->first + r->second ? r->first : 0;
}

CUresult ForeignVmm::Reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  MutexLock lock(&mu_);
  const CUresult r = driver_.cuMemAddressReserve(ptr, size, alignment, addr, flags);
  if (r == CUDA_SUCCESS && ptr != nullptr && size > 0) reservations_[*ptr] = size;
  return r;
}

CUresult ForeignVmm::Free(CUdeviceptr ptr, size_t size) {
  MutexLock lock(&mu_);
  // A run's view in it goes first (its members, if any, get views of their
  // own, which the driver then finds mapped there, as natively).
  for (CUdeviceptr run : GroupsOverlappingLocked(ptr, size)) {
    if (absl::Status s = DissolveGroupLocked(run); !s.ok()) return ToCuResult(s);
  }
  const CUresult r = driver_.cuMemAddressFree(ptr, size);
  if (r == CUDA_SUCCESS) reservations_.erase(ptr);
  return r;
}

bool ForeignVmm::ShownLocked(const Handle& h, const Mapping& m) const {
  if (m.view.mapped()) return true;
  if (h.group == 0) return false;
  auto g = groups_.find(h.group);
  return g != groups_.end() && g->second.view.mapped();
}

}  // namespace vmmshim

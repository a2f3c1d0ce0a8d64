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

// ForeignVmm's pause and resume steps (PauseCoordinator, core/heap/pause.h, drives them): what a pause
// takes from other libraries' VMM memory and how a resume maps it back.

namespace vmmshim {

bool ForeignVmm::SelectedLocked(const Handle& h, const TagSelection& tag) const {
  return h.device >= 0 && !h.imported && !h.exported && h.mappings > 0 && tag.Matches(h.tag);
}

std::vector<absl::btree_map<CUdeviceptr, ForeignVmm::Mapping>::iterator>
ForeignVmm::MappingsOfLocked(HandleValue value) {
  std::vector<absl::btree_map<CUdeviceptr, Mapping>::iterator> out;
  for (auto m = mappings_.begin(); m != mappings_.end(); ++m) {
    if (m->second.handle == value) out.push_back(m);
  }
  return out;
}

void ForeignVmm::ReleaseOrphansLocked() {
  std::vector<HandleValue> left;
  for (HandleValue real : orphans_) {
    const CUresult r = driver_.cuMemRelease(real);
    // A handle the driver says is not one (released after all, or never
    // valid) is not retried: its value may name someone else's handle later.
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE && r != CUDA_ERROR_INVALID_HANDLE) {
      left.push_back(real);
    }
  }
  orphans_ = std::move(left);
}

void ForeignVmm::AddContextsLocked(const TagSelection& tag, bool paused_views,
                                   std::vector<CUcontext>* contexts) const {
  auto add = [&](CUcontext ctx) {
    if (ctx != nullptr && std::find(contexts->begin(), contexts->end(), ctx) == contexts->end()) {
      contexts->push_back(ctx);
    }
  };
  DeviceSet peers;
  for (const auto& [at, m] : mappings_) {
    auto h = handles_.find(m.handle);
    if (h == handles_.end()) continue;
    const bool wanted = paused_views ? h->second.paused && tag.Matches(h->second.tag) &&
                                           ShownLocked(h->second, m)
                                     : !h->second.paused && SelectedLocked(h->second, tag);
    if (!wanted) continue;
    add(ContextForLocked(h->second));
    peers |= (DevicesOf(m, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) |
              DevicesOf(m, CU_MEM_ACCESS_FLAGS_PROT_READ)) -
             DeviceSet::Of(h->second.device);
  }
  // A peer's kernel may be reading the memory too: its device's primary
  // context (the one the runtime uses) finishes its work as well.
  for (int peer : peers) add(ActivePrimaryContext(driver_, peer));
}

size_t ForeignVmm::PauseCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) {
  size_t bytes = 0;
  for (const auto& [value, h] : handles_) {
    if (!h.paused && SelectedLocked(h, tag)) bytes += h.size;
  }
  AddContextsLocked(tag, /*paused_views=*/false, contexts);
  return bytes;
}

absl::StatusOr<size_t> ForeignVmm::PausePrepare(const TagSelection& tag, BackupCopier* copier,
                                                PauseTimes* times) {
  std::vector<HandleValue> chosen;
  for (const auto& [value, h] : handles_) {
    if (!h.paused && !h.pausing && SelectedLocked(h, tag)) chosen.push_back(value);
  }
  // What is copied: each run of Note [Adjacent handles share one view] as
  // one (at its first member), every other handle alone; in `chosen`'s order,
  // the commit's.
  std::vector<CUdeviceptr> formed;
  if (copier != nullptr && copier->kind().addressable) formed = FormGroupsLocked(chosen);
  struct Unit {
    HandleValue value;
    CUdeviceptr group;  // 0: the handle alone
    size_t bytes;
  };
  std::vector<Unit> units;
  for (HandleValue value : chosen) {
    const Handle& h = handles_.at(value);
    if (h.group == 0) {
      units.push_back({value, 0, h.size});
    } else if (const ViewGroup& g = groups_.at(h.group); g.members.front() == value) {
      units.push_back({value, h.group, g.bytes});
    }
  }
  auto fail = [&](absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (CUdeviceptr at : formed) EraseGroupLocked(at);
    return status;
  };
  // Backups first, all of them: host memory that runs out pauses nothing.
  std::vector<HostBackup> backups(units.size());
  if (copier != nullptr) {
    const auto start = std::chrono::steady_clock::now();
    // By device: host memory a pool keeps for the next pause, where the
    // pause maps host memory (the copy engine's speed from the second
    // cycle; BackupKind::addressable), else new host memory. Never a file:
    // this memory is the library's, kept in host memory (mapped at its
    // mappings by MapViewsLocked).
    std::map<int, std::vector<size_t>> by_device;
    for (size_t i = 0; i < units.size(); ++i) {
      by_device[handles_.at(units[i].value).device].push_back(i);
    }
    for (const auto& [device, indexes] : by_device) {
      std::vector<size_t> sizes;
      for (size_t i : indexes) sizes.push_back(units[i].bytes);
      ContextScope scope(driver_, ContextForLocked(handles_.at(units[indexes[0]].value)));
      absl::StatusOr<std::vector<HostBackup>> made =
          copier->NewBackups(device, sizes, std::vector<std::string>(sizes.size()));
      if (!made.ok()) {
        Log().error("vmmshim_pause_memory({}): other libraries' VMM memory: {}; nothing paused",
                    tag.Describe(), made.status().ToString());
        return fail(made.status());
      }
      for (size_t k = 0; k < indexes.size(); ++k) backups[indexes[k]] = std::move((*made)[k]);
    }
    // The whole handle, whatever of it is mapped: the library may map any
    // part of it later, and natively its contents stay. A run: its range,
    // each member mapped there whole and readable (FormGroupsLocked).
    for (size_t i = 0; i < units.size(); ++i) {
      const Unit& u = units[i];
      const Handle& h = handles_.at(u.value);
      ContextScope scope(driver_, ContextForLocked(h));
      times->CopyStarting();
      absl::Status copied =
          u.group != 0
              ? copier->ToHost(backups[i], u.group)
              : WithWholeHandleLocked(u.value, h.real, [&](CUdeviceptr base, bool temporary) {
                  absl::Status s = copier->ToHost(backups[i], base);
                  // A mapping made for the copy goes at return: the copy first.
                  return s.ok() && temporary ? copier->Finish() : s;
                });
      if (!copied.ok()) {
        Log().error("vmmshim_pause_memory({}): copying handle {:#x} ({} bytes, another "
                    "library's VMM memory) to host memory: {}; nothing paused",
                    tag.Describe(), u.value, u.bytes, copied.ToString());
        copier->Finish().IgnoreError();  // copies under way into `backups`, which go now
        return fail(copied);
      }
      times->copied_bytes += u.bytes;
    }
    times->copy += PauseTimes::Since(start);
  }
  size_t bytes = 0;
  for (HandleValue value : chosen) {
    Handle& h = handles_.at(value);
    h.pausing = true;
    bytes += h.size;
  }
  for (size_t i = 0; i < units.size() && copier != nullptr; ++i) {
    if (units[i].group != 0) {
      groups_.at(units[i].group).backup = std::move(backups[i]);
    } else {
      handles_.at(units[i].value).backup = std::move(backups[i]);
    }
  }
  return bytes;
}

void ForeignVmm::PauseAbort(const TagSelection&) {
  for (auto& [value, h] : handles_) {
    if (!h.pausing) continue;
    h.pausing = false;
    h.backup.reset();
    if (h.group != 0) EraseGroupLocked(h.group);
  }
}

void ForeignVmm::ResumeCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) {
  AddContextsLocked(tag, /*paused_views=*/true, contexts);
}

bool ForeignVmm::ReleaseForPauseLocked(HandleValue value, const TagSelection& tag,
                                       PauseTimes* times, bool views, absl::Status* first) {
  Handle& h = handles_.at(value);
  // Unmapped everywhere, or left whole and live.
  std::vector<absl::btree_map<CUdeviceptr, Mapping>::iterator> unmapped;
  absl::Status status;
  for (auto m : MappingsOfLocked(value)) {
    if (CUresult r = driver_.cuMemUnmap(m->first, m->second.size); r != CUDA_SUCCESS) {
      status = DriverError(r, "cuMemUnmap");
      break;
    }
    unmapped.push_back(m);
  }
  if (!status.ok()) {
    for (auto m : unmapped) {
      const Mapping& mapping = m->second;
      if (driver_.cuMemMap(m->first, mapping.size, mapping.offset, h.real, 0) != CUDA_SUCCESS ||
          (!mapping.access.empty() &&
           driver_.cuMemSetAccess(m->first, mapping.size, mapping.access.data(),
                                  mapping.access.size()) != CUDA_SUCCESS)) {
        Log().error("vmmshim_pause_memory({}): mapping {:#x} again after a failed unmap "
                    "failed: an access to it faults",
                    tag.Describe(), m->first);
      }
    }
    Log().warn("vmmshim_pause_memory({}): another library's VMM memory (handle {:#x}): {}; "
               "left live",
               tag.Describe(), value, status.ToString());
    h.backup.reset();
    first->Update(status);
    return false;
  }
  // Every driver reference goes: the library's releases are answered here
  // until resume.
  const int references = h.one_driver_reference ? std::min(h.references, 1) : h.references;
  for (int i = 0; i < references; ++i) {
    if (driver_.cuMemRelease(h.real) != CUDA_SUCCESS) {
      Log().warn("vmmshim_pause_memory({}): cuMemRelease of handle {:#x} failed; retried at "
                 "the next pause or resume",
                 tag.Describe(), h.real);
      orphans_.insert(orphans_.end(), references - i, h.real);
      break;
    }
  }
  names_.erase(h.real);
  h.real = 0;
  h.one_driver_reference = false;
  h.paused = true;
  h.wants_view = views;
  ++times->blocks;
  return true;
}

absl::StatusOr<size_t> ForeignVmm::PauseCommit(const TagSelection& tag, BackupCopier* copier,
                                               HostMappedPools* views, PauseTimes* times) {
  const auto start = std::chrono::steady_clock::now();
  ReleaseOrphansLocked();
  std::vector<HandleValue> marked;
  for (const auto& [value, h] : handles_) {
    if (h.pausing) marked.push_back(value);
  }
  size_t released = 0;
  double waited = 0;  // for copies: counted as theirs, not the release's
  absl::Status first;
  // Note [A pause's memory goes as its copy completes]
  // (core/heap/pausable_memory.h): false when the copy failed (logged).
  auto copied = [&](const HostBackup& backup, HandleValue value, size_t size) {
    const auto wait = std::chrono::steady_clock::now();
    absl::Status s = copier->WaitCopied(backup);
    waited += PauseTimes::Since(wait);
    times->CopiesDone();
    if (s.ok()) return true;
    Log().error("vmmshim_pause_memory({}): copying handle {:#x} ({} bytes, another "
                "library's VMM memory) to host memory: {}; left live",
                tag.Describe(), value, size, s.ToString());
    first.Update(s);
    return false;
  };
  for (HandleValue value : marked) {
    Handle& h = handles_.at(value);
    if (!h.pausing) continue;  // committed with its run
    if (h.group != 0) {
      // Note [Adjacent handles share one view]: the run, at its first member.
      const CUdeviceptr at = h.group;
      ViewGroup& g = groups_.at(at);
      if (value != g.members.front()) continue;
      for (HandleValue member : g.members) handles_.at(member).pausing = false;
      if (copier != nullptr && g.backup.has_value() && !copied(*g.backup, value, g.bytes)) {
        EraseGroupLocked(at);
        continue;
      }
      std::vector<HandleValue> paused;
      for (HandleValue member : g.members) {
        if (ReleaseForPauseLocked(member, tag, times, views != nullptr, &first)) {
          paused.push_back(member);
          released += handles_.at(member).size;
        } else {
          handles_.at(member).group = 0;
        }
      }
      const bool whole = paused.size() == g.members.size();
      g.members = std::move(paused);
      if (views == nullptr) continue;
      const auto step = std::chrono::steady_clock::now();
      if (whole) {
        MapGroupViewLocked(at, views->For(g.device));
      } else {
        g.pool = views->For(g.device);
        // One of them stays live: the others view their own memory.
        if (absl::Status s = DissolveGroupLocked(at); !s.ok()) {
          Log().warn("vmmshim_pause_memory({}): other libraries' paused memory at {:#x} is not "
                     "addressable: {}; an access to it faults",
                     tag.Describe(), at, s.ToString());
        }
      }
      times->views += PauseTimes::Since(step);
      continue;
    }
    h.pausing = false;
    if (copier != nullptr && h.backup.has_value() && !copied(*h.backup, value, h.size)) {
      h.backup.reset();
      continue;
    }
    if (!ReleaseForPauseLocked(value, tag, times, views != nullptr, &first)) continue;
    released += h.size;
    if (views != nullptr) {
      const auto step = std::chrono::steady_clock::now();
      MapViewsLocked(value, *views);
      times->views += PauseTimes::Since(step);
    }
  }
  times->copy += waited;
  times->release += PauseTimes::Since(start) - waited;
  if (!first.ok()) return first;
  return released;
}

absl::StatusOr<size_t> ForeignVmm::ResumePrepare(const TagSelection& tag, BackupCopier& copier,
                                                 HostMappedPools* views,
                                                 PauseTimes* times) {
  ReleaseOrphansLocked();
  std::vector<HandleValue> chosen;
  for (const auto& [value, h] : handles_) {
    if (h.paused && h.real == 0 && tag.Matches(h.tag)) chosen.push_back(value);
  }
  size_t bytes = 0;
  for (HandleValue value : chosen) {
    Handle& h = handles_.at(value);
    // The views go first: the device memory is mapped where they are (a
    // run's, at its first member resumed).
    auto step = std::chrono::steady_clock::now();
    absl::Status status;
    if (h.group != 0) status = UnmapGroupViewLocked(h.group);
    for (auto m : MappingsOfLocked(value)) status.Update(UnmapPausedLocked(m->first, m->second));
    times->views += PauseTimes::Since(step);
    step = std::chrono::steady_clock::now();
    HandleValue real = 0;
    CUresult r = status.ok() ? driver_.cuMemCreate(&real, h.size, &h.prop, 0) : CUDA_SUCCESS;
    times->create += PauseTimes::Since(step);
    if (status.ok()) status = DriverError(r, "cuMemCreate");
    if (status.ok()) {
      step = std::chrono::steady_clock::now();
      status = MapAllLocked(value, real);
      times->map += PauseTimes::Since(step);
      if (!status.ok() && driver_.cuMemRelease(real) != CUDA_SUCCESS) orphans_.push_back(real);
    }
    if (!status.ok()) {
      Log().warn("vmmshim_resume_memory({}): {} bytes of another library's VMM memory on device "
                 "{}: {}; everything stays paused",
                 tag.Describe(), h.size, h.device, status.ToString());
      copier.Finish().IgnoreError();  // copies under way into memory unmapped now
      ResumeAbort(tag, views);
      return status;
    }
    h.real = real;
    if (real != value) names_[real] = value;
    bytes += h.size;
    ++times->blocks;
    // Its copy starts now, while the next handle's views are unmapped and
    // its memory made and mapped (as the shim's blocks: ArenaPause). A
    // run's member: its part of the run's copy.
    const HostBackup* source = h.backup ? &*h.backup : nullptr;
    if (h.group != 0 && groups_.at(h.group).backup) source = &*groups_.at(h.group).backup;
    if (source == nullptr) continue;
    step = std::chrono::steady_clock::now();
    ContextScope scope(driver_, ContextForLocked(h));
    times->CopyStarting();
    const size_t offset = h.group != 0 ? h.group_offset : 0;
    absl::Status copied =
        WithWholeHandleLocked(value, h.real, [&](CUdeviceptr base, bool temporary) {
          absl::Status s = copier.ToDevice(base, *source, offset, h.size);
          return s.ok() && temporary ? copier.Finish() : s;
        });
    times->copy += PauseTimes::Since(step);
    if (!copied.ok()) {
      Log().warn("vmmshim_resume_memory({}): restoring handle {:#x} ({} bytes): {}; everything "
                 "stays paused",
                 tag.Describe(), value, h.size, copied.ToString());
      copier.Finish().IgnoreError();  // copies under way into memory unmapped now
      ResumeAbort(tag, views);
      return copied;
    }
    times->copied_bytes += h.size;
  }
  return bytes;
}

void ForeignVmm::ResumeCommit(const TagSelection&, bool /*retain_contents*/) {
  // Runs whose members are all resumed go, their memory with them.
  std::vector<CUdeviceptr> resumed;
  for (const auto& [at, g] : groups_) {
    if (std::all_of(g.members.begin(), g.members.end(),
                    [&](HandleValue value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          const Handle& h = handles_.at(value);
          return h.paused && h.real != 0;
        })) {
      resumed.push_back(at);
    }
  }
  for (CUdeviceptr at : resumed) EraseGroupLocked(at);
  for (auto it = handles_.begin(); it != handles_.end();) {
    Handle& h = it->second;
    auto next = std::next(it);
    if (h.paused && h.real != 0) {
      h.paused = false;
      h.backup.reset();
      h.one_driver_reference = true;
      if (h.references == 0) {
        // Released by the library while paused: its mappings alone keep it.
        if (driver_.cuMemRelease(h.real) != CUDA_SUCCESS) orphans_.push_back(h.real);
        MaybeForgetLocked(it);
      }
    }
    it = next;
  }
}

void ForeignVmm::DropBackups() {
  MutexLock lock(&mu_);
  for (auto& [at, g] : groups_) {
    if (!UnmapGroupViewLocked(at).ok() && g.backup) g.backup->Abandon();  // still shown
    g.backup.reset();
  }
  while (!groups_.empty()) EraseGroupLocked(groups_.begin()->first);
  for (auto& [value, h] : handles_) {
    if (!h.paused) continue;
    bool unmapped = true;
    for (auto m : MappingsOfLocked(value)) unmapped &= UnmapPausedLocked(m->first, m->second).ok();
    if (h.backup && !unmapped) h.backup->Abandon();  // still shown somewhere
    h.backup.reset();
  }
}

void ForeignVmm::ResumeAbort(const TagSelection&, HostMappedPools* views) {
  for (auto& [value, h] : handles_) {
    if (!h.paused) continue;
    if (h.real != 0) {
      // A mapping that will not unmap stays marked, unmapped again first
      // by the next resume or the library's unmap; the others get views.
      for (auto m : MappingsOfLocked(value)) {
        if (CUresult r = driver_.cuMemUnmap(m->first, m->second.size); r != CUDA_SUCCESS) {
          Log().warn("vmmshim_resume_memory: unmapping {:#x} after a failed resume: {}",
                     m->first, static_cast<int>(r));
          m->second.stale = true;
        }
      }
      if (driver_.cuMemRelease(h.real) != CUDA_SUCCESS) orphans_.push_back(h.real);
      names_.erase(h.real);
      h.real = 0;
    }
    // Still paused: the views its resume took away come back.
    if (views != nullptr && h.wants_view) MapViewsLocked(value, *views);
  }
}

}  // namespace vmmshim

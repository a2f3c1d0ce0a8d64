// ArenaPause (core/heap/arena_pause.h): a heap arena's pause and resume; the
// views of paused blocks are in arena_pause_views.cc.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/heap/arena_pause.h"
#include "core/heap/heap_arena.h"
#include "core/base/log.h"

namespace vmmshim {
namespace {

// Pushes `ctx` current for the copies of one block; pops at scope exit.
class ScopedContext {
 public:
  ScopedContext(const DriverApi& driver, CUcontext ctx) : driver_(driver) {
    pushed_ = driver_.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    CUcontext popped;
    if (pushed_) driver_.cuCtxPopCurrent_v2(&popped);
  }
  bool ok() const { return pushed_; }

 private:
  const DriverApi& driver_;
  bool pushed_ = false;
};

void AddOnce(CUcontext ctx, std::vector<CUcontext>* contexts) {
  if (std::find(contexts->begin(), contexts->end(), ctx) == contexts->end()) {
    contexts->push_back(ctx);
  }
}

}  // namespace

void ArenaPause::AddPeerContexts(DeviceSet access, std::vector<CUcontext>* contexts) const {
  for (int peer : access - DeviceSet::Of(arena_.options_.device)) {
    if (CUcontext ctx = ActivePrimaryContext(arena_.driver_, peer); ctx != nullptr) {
      AddOnce(ctx, contexts);
    }
  }
}

size_t ArenaPause::PauseCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) {
  MutexLock lock(&arena_.mu_);
  size_t bytes = 0;
  DeviceSet peers;
  for (const auto& [base, b] : arena_.blocks_.blocks()) {
    if (!Selected(*b, tag) || b->paused || b->idle()) continue;
    bytes += b->size;
    AddOnce(b->placement.context, contexts);
    peers |= b->access;
  }
  AddPeerContexts(peers, contexts);
  return bytes;
}

absl::Status ArenaPause::CheckPausable(const TagSelection& tag) const {
  MutexLock lock(&arena_.mu_);
  for (const auto& [base, b] : arena_.blocks_.blocks()) {
    if (!Selected(*b, tag) || b->paused || !b->exported) continue;
    Log().warn("vmmshim_pause_memory({}): refused: the memory at {:#x} on device {} is exported "
               "to another process (cudaIpcGetMemHandle); nothing paused",
               tag.Describe(), base, arena_.options_.device);
    return DriverError(CUDA_ERROR_NOT_PERMITTED, "vmmshim_pause_memory");
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> ArenaPause::PausePrepare(const TagSelection& tag, BackupCopier* copier,
                                               PauseTimes* times) {
  MutexLock lock(&arena_.mu_);
  std::vector<CUdeviceptr> live;
  for (const auto& [base, b] : arena_.blocks_.blocks()) {
    if (!Selected(*b, tag) || b->paused || b->pausing || b->idle()) continue;
    if (b->exported) {  // exported after CheckPausable
      Log().warn("vmmshim_pause_memory({}): refused: the memory at {:#x} on device {} is "
                 "exported to another process; nothing paused",
                 tag.Describe(), base, arena_.options_.device);
      return DriverError(CUDA_ERROR_NOT_PERMITTED, "vmmshim_pause_memory");
    }
    live.push_back(base);
  }
  // Backups first, all of them: host memory that runs out pauses nothing.
  // A block's retained backup is written again in place (same address).
  std::vector<HostBackup> backups(live.size());
  if (copier != nullptr) {
    const auto backups_start = std::chrono::steady_clock::now();
    std::vector<size_t> fresh, sizes;  // blocks without a retained backup
    std::vector<std::string> names;
    for (size_t i = 0; i < live.size(); ++i) {
      Block& b = arena_.blocks_.Get(live[i]);
      if (b.backup.has_value()) {
        backups[i] = std::move(*b.backup);
        b.backup.reset();
      } else {
        fresh.push_back(i);
        sizes.push_back(b.size);
        names.push_back(absl::StrFormat("vmmshim-%d-device%d-%#x.backup", getpid(),
                                        arena_.options_.device, live[i]));
      }
    }
    if (!fresh.empty()) {
      // A context: the pinned pool's check and a pinning need one.
      ScopedContext ctx(arena_.driver_, arena_.blocks_.Get(live[fresh[0]]).placement.context);
      absl::StatusOr<std::vector<HostBackup>> made =
          copier->NewBackups(arena_.options_.device, sizes, names);
      if (!made.ok()) {
        Log().error("vmmshim_pause_memory({}): {}; nothing paused", tag.Describe(),
                    made.status().ToString());
        for (size_t i = 0; i < live.size(); ++i) {  // retained backups stay theirs
          if (backups[i].data() != nullptr) arena_.blocks_.Get(live[i]).backup = std::move(backups[i]);
        }
        return made.status();
      }
      for (size_t k = 0; k < fresh.size(); ++k) backups[fresh[k]] = std::move((*made)[k]);
    }
    for (size_t i = 0; i < live.size(); ++i) {
      HostBackup& backup = backups[i];
      if (!copier->kind().page_locked || backup.in_file() || backup.page_locked()) continue;
      // Pinning is for speed: a refusal (a memlock limit) leaves it pageable.
      ScopedContext ctx(arena_.driver_, arena_.blocks_.Get(live[i]).placement.context);
      if (absl::Status st = backup.PageLock(arena_.driver_); !st.ok()) {
        Log().warn("vmmshim_pause_memory({}): page-locking the copy of {:#x}: {}; kept "
                   "pageable",
                   tag.Describe(), live[i], st.ToString());
      }
    }
    times->backups += PauseTimes::Since(backups_start);
    const auto copy_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < live.size(); ++i) {
      const Block& b = arena_.blocks_.Get(live[i]);
      ScopedContext ctx(arena_.driver_, b.placement.context);
      times->CopyStarting();
      absl::Status copied = ctx.ok() ? copier->ToHost(backups[i], live[i])
                                     : DriverError(CUDA_ERROR_INVALID_CONTEXT,
                                                   "vmmshim_pause_memory");
      if (!copied.ok()) {
        Log().error("vmmshim_pause_memory({}): copying {} bytes at {:#x} to host memory: {}; "
                    "nothing paused",
                    tag.Describe(), b.size, live[i], copied.ToString());
        copier->Finish().IgnoreError();  // copies under way into `backups`, which go now
        return copied;
      }
      times->copied_bytes += b.size;
    }
    times->copy += PauseTimes::Since(copy_start);
  }
  size_t bytes = 0;
  for (size_t i = 0; i < live.size(); ++i) {
    Block& b = arena_.blocks_.Get(live[i]);
    b.pausing = true;
    // Without contents, a retained copy is stale: it goes.
    b.backup.reset();
    if (copier != nullptr) b.backup = std::move(backups[i]);
    arena_.blocks_.Withdraw(live[i], b);
    bytes += b.size;
  }
  return bytes;
}

void ArenaPause::PauseAbort(const TagSelection& tag) {
  MutexLock lock(&arena_.mu_);
  std::vector<CUdeviceptr> freed;
  for (auto& [base, owned] : arena_.blocks_.blocks()) {
    Block& b = *owned;
    if (!Selected(b, tag) || !b.pausing) continue;
    b.pausing = false;
    b.backup.reset();
    if (b.freed_while_pausing) {
      freed.push_back(base);
    } else {
      arena_.blocks_.Reopen(base, b);
    }
  }
  // Note [A block freed while its pause is under way] (arena_pause.h): the
  // copies were waited for before the abort.
  for (CUdeviceptr base : freed) ReleaseFreedLocked(tag, base);
}

bool ArenaPause::ReleaseFreedLocked(const TagSelection& tag, CUdeviceptr base) {
  const size_t size = arena_.blocks_.Get(base).size;
  const size_t orphaned = arena_.orphans_.bytes();
  if (absl::Status s = arena_.DestroyBlockLocked(base); !s.ok()) {
    // Kept mapped and counted, as a free that cannot unmap keeps a block.
    Log().warn("vmmshim_pause_memory({}): releasing memory at {:#x} ({} bytes) freed during the "
               "pause: {}; retried by Trim",
               tag.Describe(), base, size, s.ToString());
    if (arena_.blocks_.Contains(base)) {
      arena_.ForgetBlockLocked(base, HeapArena::Forget::kStillMapped);
    }
    return false;
  }
  return arena_.orphans_.bytes() == orphaned;  // else its handle is kept, retried by Trim
}

absl::StatusOr<size_t> ArenaPause::PauseCommit(const TagSelection& tag, BackupCopier* copier,
                                               HostMappedPools* views, PauseTimes* times) {
  MutexLock lock(&arena_.mu_);
  const auto start = std::chrono::steady_clock::now();
  std::vector<CUdeviceptr> marked, cached;
  for (const auto& [base, b] : arena_.blocks_.blocks()) {
    if (!Selected(*b, tag) || b->paused) continue;
    if (b->pausing) {
      marked.push_back(base);
    } else if (b->idle()) {
      cached.push_back(base);
    }
  }
  size_t released = 0;
  double waited = 0;  // for copies: counted as theirs, not the release's
  absl::Status first;
  for (CUdeviceptr base : marked) {
    Block& b = arena_.blocks_.Get(base);
    b.pausing = false;
    if (copier != nullptr && b.backup.has_value()) {
      // Note [A pause's memory goes as its copy completes].
      const auto wait = std::chrono::steady_clock::now();
      absl::Status copied = copier->WaitCopied(*b.backup);
      waited += PauseTimes::Since(wait);
      times->CopiesDone();
      if (!copied.ok() && !b.freed_while_pausing) {
        Log().error("vmmshim_pause_memory({}): copying {} bytes at {:#x} to host memory: {}; "
                    "left live",
                    tag.Describe(), b.size, base, copied.ToString());
        b.backup.reset();
        arena_.blocks_.Reopen(base, b);
        first.Update(copied);
        continue;
      }
    }
    if (b.freed_while_pausing) {
      // Note [A block freed while its pause is under way] (arena_pause.h).
      const size_t size = b.size;  // the block and its backup go with it
      if (ReleaseFreedLocked(tag, base)) released += size;
      continue;
    }
    if (absl::Status s = arena_.mapper_.Unmap(base, b.size); !s.ok()) {
      // Still mapped and whole: it stays live (its backup goes).
      Log().warn("vmmshim_pause_memory({}): unmapping {:#x}: {}; left live", tag.Describe(), base,
                 s.ToString());
      b.backup.reset();
      arena_.blocks_.Reopen(base, b);
      first.Update(s);
      continue;
    }
    if (absl::Status s = arena_.mapper_.Release(b.handle); !s.ok()) {
      // The driver did not get it back: counted until Trim's retry succeeds.
      Log().warn("device {}: {}; retried by Trim", arena_.options_.device, s.ToString());
      arena_.orphans_.AddHandle(b.handle, b.size);
    } else {
      arena_.acct_.Handle(-static_cast<int64_t>(b.size));
      released += b.size;
    }
    arena_.acct_.Mapped(b.access - DeviceSet::Of(arena_.options_.device), -static_cast<int64_t>(b.size));
    arena_.acct_.PoolReserved(b.placement.stream_ordered, -static_cast<int64_t>(b.size));
    arena_.RecordSegmentLocked(HistoryAction::kSegmentUnmap, base, b);
    const DeviceSet had_access = b.access | DeviceSet::Of(arena_.options_.device);
    b.handle = 0;
    b.access = DeviceSet();
    b.paused = true;
    arena_.acct_.Paused(static_cast<int64_t>(b.size));
    ++times->blocks;
    b.wants_view = views != nullptr;
    if (views != nullptr) {
      const auto step = std::chrono::steady_clock::now();
      MapViewLocked(base, b, had_access, *views);
      times->views += PauseTimes::Since(step);
    }
  }
  // The tag's freed memory goes too: it is memory the program gave up.
  for (CUdeviceptr base : cached) {
    const size_t size = arena_.blocks_.Get(base).size;
    if (absl::Status s = arena_.DestroyBlockLocked(base); s.ok()) {
      released += size;
    } else {
      Log().warn("vmmshim_pause_memory({}): releasing cached memory at {:#x}: {}", tag.Describe(),
                 base, s.ToString());
    }
  }
  times->copy += waited;
  times->release += PauseTimes::Since(start) - waited;
  if (!first.ok()) return first;
  return released;
}

void ArenaPause::ResumeCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) {
  MutexLock lock(&arena_.mu_);
  DeviceSet peers;
  for (const auto& [base, b] : arena_.blocks_.blocks()) {
    if (!Selected(*b, tag) || !b->paused || !b->view.mapped()) continue;
    AddOnce(b->placement.context, contexts);
    peers |= arena_.access_.Target(*b);
  }
  AddPeerContexts(peers, contexts);
}

absl::StatusOr<size_t> ArenaPause::ResumePrepare(const TagSelection& tag, BackupCopier& copier,
                                                HostMappedPools* views, PauseTimes* times) {
  MutexLock lock(&arena_.mu_);
  // Handles a pause or an earlier undo could not release hold memory the
  // resume may need.
  arena_.orphans_.Retry(arena_.mapper_, arena_.va_, arena_.acct_);
  std::vector<CUdeviceptr> paused, mapped_now;
  for (const auto& [base, owned] : arena_.blocks_.blocks()) {
    if (Selected(*owned, tag) && owned->paused) paused.push_back(base);
  }
  auto undo = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(arena_.mu_) {
    for (CUdeviceptr base : mapped_now) {
      arena_.UnmapPausedLocked(base);
      MapViewAgainLocked(base, arena_.blocks_.Get(base), views);
    }
  };
  // Device memory for paused `b` at `base`: made (after this arena's cache
  // once, when the device is full), its view unmapped, mapped with the access
  // it would have had; on failure logged, nothing of it left and its view
  // mapped again.
  auto map_device_memory = [&](CUdeviceptr base, Block& b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(arena_.mu_) -> absl::Status {
    auto step = std::chrono::steady_clock::now();
    absl::StatusOr<CUmemGenericAllocationHandle> handle =
        arena_.mapper_.Create(b.size, arena_.create_.prop());
    if (!handle.ok() && ToCuResult(handle.status()) == CUDA_ERROR_OUT_OF_MEMORY) {
      times->create += PauseTimes::Since(step);
      step = std::chrono::steady_clock::now();
      arena_.TrimLocked();  // this arena's cache and orphans
      times->trim += PauseTimes::Since(step);
      step = std::chrono::steady_clock::now();
      handle = arena_.mapper_.Create(b.size, arena_.create_.prop());
    }
    times->create += PauseTimes::Since(step);
    // Exactly the access it would have had, never paused: the owner, and the
    // peers the policy or explicit grants allow among those enabled now.
    const DeviceSet target = arena_.access_.Target(b) | DeviceSet::Of(arena_.options_.device);
    absl::Status status = handle.status();
    if (handle.ok() && b.view.mapped()) {  // the contexts were synchronized
      step = std::chrono::steady_clock::now();
      status = arena_.UnmapPausedViewLocked(base, b);
      times->views += PauseTimes::Since(step);
      if (!status.ok() && !arena_.mapper_.Release(*handle).ok()) {
        arena_.orphans_.AddHandle(*handle, b.size);
        arena_.acct_.Handle(static_cast<int64_t>(b.size));  // counted until released
      }
    }
    if (handle.ok() && status.ok()) {
      step = std::chrono::steady_clock::now();
      status = arena_.mapper_.MapWithAccess(base, b.size, *handle, target);
      times->map += PauseTimes::Since(step);
      if (!status.ok() && !arena_.mapper_.Release(*handle).ok()) {
        arena_.orphans_.AddHandle(*handle, b.size);
        arena_.acct_.Handle(static_cast<int64_t>(b.size));  // counted until released
      }
    }
    if (!status.ok()) {
      Log().warn("vmmshim_resume_memory({}): {} bytes at {:#x} on device {}: {}; everything "
                 "stays paused",
                 tag.Describe(), b.size, base, arena_.options_.device, status.ToString());
      MapViewAgainLocked(base, b, views);
      return status;
    }
    ++arena_.acct_.stats().set_access_calls;
    b.handle = *handle;
    b.access = target;
    arena_.acct_.Handle(static_cast<int64_t>(b.size));
    arena_.acct_.PoolReserved(b.placement.stream_ordered, static_cast<int64_t>(b.size));
    arena_.acct_.Mapped(target - DeviceSet::Of(arena_.options_.device), static_cast<int64_t>(b.size));
    return absl::OkStatus();
  };
  size_t bytes = 0;
  for (CUdeviceptr base : paused) {
    Block& b = arena_.blocks_.Get(base);
    bytes += b.size;
    // A block still mapped by a failed undo is reused as it is.
    if (b.handle == 0) {
      if (absl::Status mapped = map_device_memory(base, b); !mapped.ok()) {
        copier.Finish().IgnoreError();  // copies under way into memory unmapped now
        undo();
        return mapped;
      }
      mapped_now.push_back(base);
    }
    // Its copy starts now (on the copy engine where the backup is page-locked,
    // complete at the copier's Finish), while the next block is made and
    // mapped and its view unmapped.
    if (!b.backup) continue;
    times->copied_bytes += b.size;
    const auto step = std::chrono::steady_clock::now();
    ScopedContext ctx(arena_.driver_, b.placement.context);
    times->CopyStarting();
    absl::Status copied = ctx.ok() ? copier.ToDevice(base, *b.backup)
                                   : DriverError(CUDA_ERROR_INVALID_CONTEXT,
                                                 "vmmshim_resume_memory");
    times->copy += PauseTimes::Since(step);
    if (!copied.ok()) {
      Log().warn("vmmshim_resume_memory({}): restoring {} bytes at {:#x}: {}; everything stays "
                 "paused",
                 tag.Describe(), b.size, base, copied.ToString());
      copier.Finish().IgnoreError();  // copies under way into memory unmapped now
      undo();
      return copied;
    }
  }
  times->blocks += paused.size();
  return bytes;
}

void ArenaPause::ResumeCommit(const TagSelection& tag, bool retain) {
  MutexLock lock(&arena_.mu_);
  for (auto& [base, owned] : arena_.blocks_.blocks()) {
    Block& b = *owned;
    if (!Selected(b, tag) || !b.paused || b.handle == 0) continue;
    b.paused = false;
    b.wants_view = false;
    if (!retain) b.backup.reset();
    arena_.acct_.Paused(-static_cast<int64_t>(b.size));
    arena_.blocks_.Reopen(base, b);
    arena_.RecordSegmentLocked(HistoryAction::kSegmentMap, base, b);
  }
}

void ArenaPause::ResumeAbort(const TagSelection& tag, HostMappedPools* views) {
  MutexLock lock(&arena_.mu_);
  std::vector<CUdeviceptr> mapped;
  for (const auto& [base, owned] : arena_.blocks_.blocks()) {
    if (Selected(*owned, tag) && owned->paused && owned->handle != 0) mapped.push_back(base);
  }
  for (CUdeviceptr base : mapped) {
    arena_.UnmapPausedLocked(base);
    MapViewAgainLocked(base, arena_.blocks_.Get(base), views);
  }
}

}  // namespace vmmshim

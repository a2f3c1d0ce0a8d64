#include "core/heap/pause.h"

#include <utility>
#include <vector>

#include "core/base/log.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/heap/host_backup.h"
#include "core/sync/shared_gate.h"

namespace vmmshim {
namespace {

// Runs `step` on every arena, even after a failure; the sum of the sizes or
// the first error (commits: every arena must be tried).
template <typename Step>
absl::StatusOr<size_t> SumOverAll(const std::vector<HeapArena*>& arenas, Step step) {
  size_t sum = 0;
  absl::Status first;
  for (HeapArena* arena : arenas) {
    absl::StatusOr<size_t> r = step(arena);
    if (r.ok()) {
      sum += *r;
    } else {
      first.Update(r.status());
    }
  }
  if (!first.ok()) return first;
  return sum;
}

}  // namespace

PauseCoordinator::PauseCoordinator(const DriverApi& driver, HeapTable& heaps,
                                   CaptureTracker& captures, int copy_threads,
                                   std::function<void()> release_caches)
    : driver_(driver),
      heaps_(heaps),
      captures_(captures),
      copy_threads_(copy_threads),
      release_caches_(std::move(release_caches)) {}

std::vector<HeapArena*> PauseCoordinator::Arenas() const {
  std::vector<HeapArena*> arenas;
  heaps_.ForEach([&](DeviceHeap* heap) {
    heap->ForEachArena([&](HeapArena* arena) { arenas.push_back(arena); });
  });
  return arenas;
}

absl::StatusOr<size_t> PauseCoordinator::Pause(const std::optional<std::string>& tag,
                                               bool keep_contents) {
  // No capture begins meanwhile; during one, the synchronize and the copies
  // would invalidate it (core/sync/capture.h): refused, the capture untouched.
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) {
    return DriverError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "vmmshim_pause_memory");
  }
  MutexLock lock(&mu_);
  const std::vector<HeapArena*> arenas = Arenas();
  std::vector<CUcontext> contexts;
  size_t live = 0;
  for (HeapArena* arena : arenas) {
    if (absl::Status s = arena->CheckPausable(tag); !s.ok()) return s;
    live += arena->PauseCandidates(tag, &contexts);
  }
  if (keep_contents && live > AvailableHostMemory()) {
    Log().error("vmmshim_pause_memory: host memory for the contents: {} bytes needed, {} "
                "available (MemAvailable); nothing paused",
                live, AvailableHostMemory());
    return DriverError(CUDA_ERROR_OUT_OF_MEMORY, "vmmshim_pause_memory (host memory)");
  }
  // The program's work on the memory must be done before it goes.
  for (CUcontext ctx : contexts) {
    if (absl::Status s = SynchronizeContext(driver_, ctx); !s.ok()) return s;
  }
  std::optional<BackupCopier> copier;
  if (keep_contents) copier.emplace(driver_, copy_threads_);
  // All or nothing: every arena copies and marks first; only then is memory
  // released anywhere. A failed prepare undoes its own marks; the abort
  // below undoes everyone's, once.
  for (HeapArena* arena : arenas) {
    absl::StatusOr<size_t> r = arena->PausePrepare(tag, copier ? &*copier : nullptr);
    if (!r.ok()) {
      for (HeapArena* a : arenas) a->PauseAbort(tag);
      return r.status();
    }
  }
  return SumOverAll(arenas, [&](HeapArena* arena) { return arena->PauseCommit(tag); });
}

absl::StatusOr<size_t> PauseCoordinator::Resume(const std::optional<std::string>& tag) {
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) {
    return DriverError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "vmmshim_resume_memory");
  }
  MutexLock lock(&mu_);
  BackupCopier copier(driver_, copy_threads_);
  const std::vector<HeapArena*> arenas = Arenas();
  absl::Status status;
  for (int attempt = 0; attempt < 2; ++attempt) {
    size_t restored = 0;
    status = absl::OkStatus();
    for (HeapArena* arena : arenas) {
      absl::StatusOr<size_t> r = arena->ResumePrepare(tag, copier);
      if (!r.ok()) {
        status = r.status();
        break;
      }
      restored += *r;
    }
    if (status.ok()) {
      for (HeapArena* arena : arenas) arena->ResumeCommit(tag);
      return restored;
    }
    // All or nothing: what other arenas prepared goes again, once.
    for (HeapArena* arena : arenas) arena->ResumeAbort(tag);
    if (ToCuResult(status) != CUDA_ERROR_OUT_OF_MEMORY) break;
    // Out of memory: every cache the shim holds (all arenas, deferred frees,
    // the stream-ordered cache) goes back to the driver, then once more.
    release_caches_();
  }
  return status;
}

}  // namespace vmmshim

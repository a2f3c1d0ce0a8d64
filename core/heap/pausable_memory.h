// Memory that pauses and resumes by tag, all or nothing with the rest: the
// one interface PauseCoordinator (core/heap/pause.h) runs each step over,
// once, for the shim's own heap arenas (core/heap/heap_arena.h) and for
// other libraries' VMM memory (core/foreign/foreign_vmm.h) alike.
//
// The coordinator, under its mutex, takes the steps in this order over every
// memory: CheckPausable; PauseCandidates (between Lock and Unlock, alone:
// the contexts it names are synchronized without the lock, since that work
// may wait on another thread's call into this memory); then, between Lock
// and Unlock from selection to commit, so that its state stays still while
// the others' steps run: PausePrepare (copies started, marks) and PauseAbort
// or PauseCommit (unmaps, releases); or ResumePrepare (creates, maps, copies
// back) and ResumeAbort or ResumeCommit. A failed step undoes itself; Abort
// undoes what an earlier successful step did, and is harmless where nothing
// was prepared.
//
// Note [A pause's memory goes as its copy completes]: the copies every
// PausePrepare started run on the copy engine while PauseCommit unmaps the
// blocks (and maps their views) one by one, each once its own copy is
// complete (BackupCopier::WaitCopied), so that the unmapping and mapping
// hide behind the copies that follow instead of coming after all of them
// (docs/pause-resume-design.md, "Paused memory stays addressable"). A copy
// that fails on the copy engine (asynchronously: the context is most likely
// lost) leaves its block live and the others paused, as a failed unmap
// does; one that fails to start fails PausePrepare, and nothing is paused. Memory whose steps take their own locks (an arena) leaves
// Lock and Unlock empty.
//
// `tag` selects what each step covers (core/heap/tag_selection.h); `times`
// (never null) collects where the time went. `views` (nullptr: none,
// VMMSHIM_PAUSED_ACCESS=fault): the host memory paused memory stays
// addressable through (core/heap/host_mapped_pool.h); a range that cannot
// map it (a mapping of part of another library's handle) has no view, and
// an access to it faults.
#ifndef VMMSHIM_CORE_HEAP_PAUSABLE_MEMORY_H_
#define VMMSHIM_CORE_HEAP_PAUSABLE_MEMORY_H_

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/heap/backup_copier.h"
#include "core/heap/host_mapped_pool.h"
#include "core/heap/tag_selection.h"

namespace vmmshim {

// Where a pause's or resume's time went, in seconds, summed over the
// memories (PauseCoordinator logs it; core/heap/pause.h).
struct PauseTimes {
  double synchronize = 0;  // the owning contexts (and stream-ordered frees) synchronized
  double backups = 0;      // host memory for the contents made or taken from a pool
  double copy = 0;         // contents to host memory, or back
  size_t copied_bytes = 0; // of them
  double views = 0;        // paused ranges mapped to host memory, or unmapped at resume
  double release = 0;      // cuMemUnmap + cuMemRelease of paused and cached blocks
  double create = 0;       // cuMemCreate at resume
  double map = 0;          // cuMemMap + cuMemSetAccess at resume
  double trim = 0;         // caches released to make room at resume
  size_t blocks = 0;       // blocks paused or resumed
  // From the first copy's start to the copier's Finish: the copies' window,
  // which other steps may share (a resume maps the next block while the
  // last one's copy runs), for their GiB/s.
  std::chrono::steady_clock::time_point copies_from{}, copies_to{};

  // Seconds from `start` to now, for the fields above.
  static double Since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void CopyStarting() {
    if (copies_from == std::chrono::steady_clock::time_point{}) {
      copies_from = std::chrono::steady_clock::now();
    }
  }
  void CopiesDone() { copies_to = std::chrono::steady_clock::now(); }
  // The copies' bytes per second of their window (of `copy` where no window
  // was marked).
  double CopyBytesPerSecond() const {
    const double window =
        copies_to > copies_from && copies_from != std::chrono::steady_clock::time_point{}
            ? std::chrono::duration<double>(copies_to - copies_from).count()
            : copy;
    return window > 0 ? static_cast<double>(copied_bytes) / window : 0.0;
  }
};

// Note [Views made late] (core/heap/pause.h), one memory's step: kept
// contents of `bytes` in `*backup` (host memory that is not host VMM
// memory) moved into host memory `pool` made for them (TakeKept), by the
// CPU in parts of PausableMemory::kLateCopyBytes. kMoved: `*backup` is that
// memory now (its view is the caller's to map). kNoneMade: none of that
// size is kept; kStopped: `waiting` rose above 0 before a part (a pause or
// resume goes first; the memory went back to the pool). Either way `*backup`
// is as it was. The caller holds the lock that guards `*backup`.
enum class LateMove { kMoved, kNoneMade, kStopped };
LateMove MoveIntoMadeHostMemory(HostMappedPool& pool, std::optional<HostBackup>* backup,
                                size_t bytes, const std::atomic<int>& waiting);

class PausableMemory {
 public:
  virtual void Lock() {}
  virtual void Unlock() {}
  // Why a pause of `tag` must be refused before anything is done (for
  // example CUDA_ERROR_NOT_PERMITTED: selected memory is exported to
  // another process), else OK.
  virtual absl::Status CheckPausable(const TagSelection& tag) const { return absl::OkStatus(); }
  // Bytes a pause with contents copies; adds the contexts to synchronize
  // (once each).
  virtual size_t PauseCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) = 0;
  // With `copier` (nullptr: contents dropped), every selected live block's
  // contents to host memory; the blocks marked so that nothing new lands in
  // them.
  virtual absl::StatusOr<size_t> PausePrepare(const TagSelection& tag, BackupCopier* copier,
                                              PauseTimes* times) = 0;
  virtual void PauseAbort(const TagSelection& tag) = 0;
  // The physical bytes released; with `views`, the paused ranges mapped to
  // their host copy (kept contents) or to scratch memory (dropped ones).
  // `copier`: PausePrepare's (nullptr: contents dropped), whose copies each
  // block's memory waits for: Note [A pause's memory goes as its copy
  // completes].
  virtual absl::StatusOr<size_t> PauseCommit(const TagSelection& tag, BackupCopier* copier,
                                             HostMappedPools* views, PauseTimes* times) = 0;
  // Adds the contexts whose work may be touching the selection's paused
  // memory through its views (once each): synchronized before
  // ResumePrepare takes the views away.
  virtual void ResumeCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) {}
  // The bytes restored. A paused range's view goes before device memory is
  // mapped there; on failure (and at ResumeAbort) it comes back with `views`.
  virtual absl::StatusOr<size_t> ResumePrepare(const TagSelection& tag, BackupCopier& copier,
                                               HostMappedPools* views, PauseTimes* times) = 0;
  // `retain_contents`: keep the host copy (PauseCoordinator::Resume); memory
  // that cannot keep it drops it.
  virtual void ResumeCommit(const TagSelection& tag, bool retain_contents) = 0;
  virtual void ResumeAbort(const TagSelection& tag, HostMappedPools* views) = 0;

  // Note [Views made late] (core/heap/pause.h): each paused block (or
  // handle) that wants a view but whose contents were kept in other host
  // memory moves them into host VMM memory `views` keeps of its size
  // (HostMappedPool::TakeKept; a CPU copy in parts of kLateCopyBytes) and
  // maps its view; blocks without such memory are left as they are.
  // Called without Lock: takes the memory's own lock block by block. Stops
  // at the next part while `waiting` is above 0 (a pause, resume or fork
  // waits for the coordinator, or a stop), the block left as it was. The
  // bytes made addressable.
  static constexpr size_t kLateCopyBytes = size_t{256} << 20;
  virtual size_t MapLateViews(HostMappedPools& views, const std::atomic<int>& waiting) {
    return 0;
  }

 protected:
  ~PausableMemory() = default;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_PAUSABLE_MEMORY_H_

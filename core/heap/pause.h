// Pause and resume by allocation tag (docs/pause-resume.md); the program
// reaches it as ShimCore::pause() (core/shim_core.h).
//
// Pause releases the physical memory of the allocations a TagSelection
// takes (core/heap/tag_selection.h: every one, one tag, or every one but
// some tags; a tag no allocation has: nothing, 0 bytes) and keeps their
// addresses reserved: freed stream-ordered blocks of the selection leave
// the stream-ordered cache first (their streams' contexts synchronized), the
// owning contexts are synchronized, with `keep_contents` the contents are
// copied to host memory (core/heap/host_backup.h), then each block is
// unmapped and released. The paused range then maps host memory, so that a
// kernel that touches it does not kill the context (docs/pause-resume.md,
// "Touching paused memory"; BackupKind::addressable): the kept contents
// themselves (read and written over the bus; the writes are there after the
// resume), or scratch memory where contents were dropped (undefined data);
// with VMMSHIM_PAUSED_ACCESS=fault, nothing (an access faults). The
// selection's cached (freed) memory is released too. Returns the physical
// bytes released (0 when all of it is paused already). Pointers stay valid
// for cudaFree and cuMemFreeAsync (which free a paused allocation as any
// other, dropping its share of the backup), Find and the peer queries
// (which answer with the access it gets back). Stream-ordered memory
// (cuMemAllocAsync from a default pool the shim serves) is paused like
// cudaMalloc memory, by the tag set when it was allocated; IPC imports are
// not selected (not this process's allocations).
// All or nothing: every arena of every device makes its backups, starts its
// copies and marks before any memory is released; each block's memory then
// goes once its own copy is complete (Note [A pause's memory goes as its
// copy completes], core/heap/pausable_memory.h). Errors (nothing paused):
// CUDA_ERROR_NOT_PERMITTED when selected memory is exported to another
// process (logged, naming it); CUDA_ERROR_OUT_OF_MEMORY when host memory for
// the contents is short (logged: needed and available); a synchronize's
// driver error, or a copy's that the driver returns when the copy is
// started. A copy that fails on the copy engine, or a cuMemUnmap failure
// (driver failures after the copies started): that block stays live, the
// others are paused, and the error is returned.
//
// Resume synchronizes the contexts that own paused memory with a view (work
// in flight may be touching it), unmaps the views, maps new physical memory
// at the paused addresses with the access
// each allocation would have had never paused (the owner, the peers that
// policy or explicit grants allow among those enabled now, by
// cuCtxEnablePeerAccess or, for stream-ordered memory, cuMemPoolSetAccess)
// and copies the contents back. Returns the bytes restored (0: nothing
// paused). CUDA_ERROR_OUT_OF_MEMORY when the devices cannot hold it all
// after every cache the shim holds was released: everything stays paused,
// nothing leaks, a later resume can succeed.
//
// When the context is lost (a sticky error such as CUDA_ERROR_ILLEGAL_ADDRESS
// from an earlier kernel: core/driver/cu_status.h IsContextLost), the error
// is that code and the log says so in words ("the CUDA context is lost: the
// kept contents cannot be mapped back"), whichever driver call met it first.
//
// Each pause and resume logs, at info, the bytes, blocks and where the time
// went (synchronize, copies, driver calls, caches released), so that a slow
// one can be explained without a profiler.
//
// Note [Views made late]: under VMMSHIM_HOST_POOL_MAKE=background a pause
// keeps contents the pools have no host VMM memory for in other host memory
// (no view: an access faults) while the pool makes that memory in the
// background. Once it is made, one thread of the coordinator's moves those
// contents into it (a CPU copy, block by block, in parts of kLateCopyBytes,
// under the pause mutex and the block's memory's own) and maps their views,
// so that the first pause of a set is addressable from a few seconds after
// it (the making's time) rather than only from the second pause. A pause,
// resume or fork that arrives meanwhile goes first: the thread stops at the
// next part (the block stays as it was) and comes back after it. Left as
// they are: blocks without host memory of their size (a limit cut it), and
// blocks whose contents' address the program was given
// (HeapArena::PausedContents: it stays valid until the resume).
//
// Thread safety: pauses and resumes are serialized with each other (lock
// order: "pause mutex", after the capture gate); allocations and frees go on
// meanwhile in other arenas, and in the same arena wait for its prepare
// step's copies (and its commit's wait for them). During a stream capture: refused, Note [Calls during a
// stream capture] (core/sync/capture.h), item 4.
#ifndef VMMSHIM_CORE_HEAP_PAUSE_H_
#define VMMSHIM_CORE_HEAP_PAUSE_H_

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "core/driver/driver_api.h"
#include "core/heap/backup_copier.h"
#include "core/heap/heap_table.h"
#include "core/heap/pausable_memory.h"
#include "core/heap/pinned_pool.h"
#include "core/heap/tag_selection.h"
#include "core/sync/capture.h"
#include "core/sync/mutex.h"

namespace vmmshim {

// A room above the heaps that holds memory a pause must see (the
// stream-ordered front end: freed blocks wait in its caches, outside the
// heaps' selection). It registers with the coordinator (AddParticipant)
// rather than the coordinator calling up into it (docs/architecture.md,
// "Callbacks").
class PauseParticipant {
 public:
  // Before a pause selects memory: the selection's memory this room holds
  // goes back to the heaps; an error refuses the pause.
  virtual absl::Status ReleaseForPause(const TagSelection& tag) = 0;
  // A resume ran out of memory: every cache this room holds goes back to
  // the driver before the retry.
  virtual void ReleaseCachesForResume() = 0;

 protected:
  ~PauseParticipant() = default;
};

// What paused memory maps (VMMSHIM_PAUSED_ACCESS, VMMSHIM_HOST_POOL_*;
// docs/pause-resume.md, "Touching paused memory").
struct PausedAccessOptions {
  // true: kept contents stay addressable in host memory and dropped ones
  // map scratch memory (core/heap/host_mapped_pool.h); false: an access
  // faults.
  bool addressable = true;
  double host_pool_idle_seconds = 300;
  // VMMSHIM_HOST_POOL_MAKE=background (HostMappedPool::Options).
  bool host_memory_in_background = false;
  // VMMSHIM_HOST_POOL_MAX (HostMappedPool::Options::max_bytes).
  size_t host_pool_max_bytes = 0;
};

class PauseCoordinator : public HeapTable::Listener {
 public:
  // The pinned pool (core/heap/pinned_pool.h; VMMSHIM_PINNED_POOL), started
  // in the background when the first heap is created (HeapCreated), in the
  // context current then.
  struct PinnedPoolOptions {
    size_t bytes = 0;  // 0: no pool
    size_t chunk_bytes = PinnedPool::kDefaultChunkBytes;
  };
  // Everything referenced must outlive the coordinator. `copy_threads` >= 1
  // (host-backup copy threads). `other`: memory the heaps do not own that
  // pauses with them (nullptr: none).
  PauseCoordinator(const DriverApi& driver, HeapTable& heaps, CaptureTracker& captures,
                   int copy_threads, PinnedPoolOptions pinned_pool, PausableMemory* other,
                   PausedAccessOptions paused_access = PausedAccessOptions());
  // `participant` (not owned; must outlive the coordinator) takes part in
  // every pause and resume from now on. Before the first pause.
  void AddParticipant(PauseParticipant* participant) ABSL_LOCKS_EXCLUDED(mu_);
  PauseCoordinator(const PauseCoordinator&) = delete;
  PauseCoordinator& operator=(const PauseCoordinator&) = delete;
  // Stops the thread of Note [Views made late] (joined).
  ~PauseCoordinator();

  // `kind`: where kept contents go (core/heap/host_backup.h: page-locked,
  // a file in a directory; the default: pageable anonymous memory). A block
  // whose contents were kept across a resume (Resume with retain_contents)
  // is copied into that same host memory again (the same address: a
  // program may hold it), page-locked then when `kind` asks. Contents to
  // a directory are not checked against MemAvailable (they go to disk).
  absl::StatusOr<size_t> Pause(const TagSelection& tag, bool keep_contents,
                               const BackupKind& kind = BackupKind()) ABSL_LOCKS_EXCLUDED(mu_);
  // `retain_contents`: the resumed blocks keep their host copy (readable
  // through HeapArena::PausedContents) until a later pause refreshes it in
  // place, a resume without it drops it, or the allocation is freed; as
  // torch_memory_saver's retain_cpu_backup. Other libraries' VMM memory
  // drops its copy either way.
  absl::StatusOr<size_t> Resume(const TagSelection& tag, bool retain_contents = false)
      ABSL_LOCKS_EXCLUDED(mu_);

  // HeapTable::Listener: the first heap starts the pinned pool (once per
  // process), registered in the context current then.
  void HeapCreated(int device) override;
  // Before the driver's process checkpoint (a deep sleep, after its pause):
  // the pinned pool drops its registrations, which the checkpoint would
  // otherwise unpin and the restore pin again (PinnedPool::Unpin); the next
  // copies register what they use. The bytes unpinned. Takes the pause
  // mutex: no pause or resume runs meanwhile.
  size_t UnpinPinnedPool() ABSL_LOCKS_EXCLUDED(mu_);

  // The physical bytes of the shim's memory paused now (one atomic load).
  uint64_t paused_bytes() const;
  // After any fill under way.
  PinnedPool::Stats pinned_pool_stats() {
    pool_.AwaitFill();
    return pool_.stats();
  }
  // Now, without waiting (a report: 0 while the pool is being made).
  PinnedPool::Stats pinned_pool_stats_now() const { return pool_.stats(); }
  // The host memory paused memory stays addressable through, per device.
  std::vector<HostMappedPool*> host_pools() const { return host_pools_.All(); }
  // What those pools keep for the next pause, released now, with their
  // scratch (teardown); the bytes released.
  size_t ReleaseHostMemory();
  // ReleaseHostMemory, the pools' threads and the late views' stopped for
  // good first (the process's exit, before the driver's teardown).
  size_t ReleaseHostMemoryForGood();
  // Before the driver's checkpoint (Note [The driver's checkpoint and host
  // VMM memory], core/heap/host_mapped_pool.h), under the pause mutex (no
  // late view takes memory meanwhile): what those pools keep and their
  // scratch, released now; the bytes released, or
  // CUDA_ERROR_ILLEGAL_STATE naming the bytes still taken (host memory a
  // view the driver would not unmap still holds, OrphanedMemory, or a view
  // of memory the program paused: the sleep refuses such a pause up front,
  // core/control/control_server.h), with nothing else changed but the
  // release.
  absl::StatusOr<size_t> ReleaseHostMemoryForCheckpoint();

  // Counted in waiting_, so that the late views' thread lets the fork go
  // first (Note [Views made late]).
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    waiting_.fetch_add(1, std::memory_order_relaxed);
    mu_.Lock();
    waiting_.fetch_sub(1, std::memory_order_relaxed);
  }
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  // The host memory pools' mutexes, leaves: taken after every other lock.
  void PrepareForkHostPools() { host_pools_.PrepareFork(); }
  void AfterForkParentHostPools() { host_pools_.AfterForkParent(); }
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    new (&mu_) Mutex;
    // The parent's thread is not the child's: the first late pause there
    // starts one.
    new (&late_thread_) std::thread();
    new (&late_wanted_) CondVar;
    late_pending_ = false;
    late_running_.store(false);
    waiting_.store(0);
    ring_.AfterForkChild();
    pool_.AfterForkChild();
    host_pools_.AfterForkChild();
  }

 private:
  // The steps of Pause and Resume; a lost context is explained after them.
  absl::StatusOr<size_t> PauseSteps(const TagSelection& tag, bool keep_contents,
                                    const BackupKind& kind) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<size_t> ResumeSteps(const TagSelection& tag, bool retain_contents)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every arena of every device, in device and arena order, then the other
  // memory: what each step runs over, once.
  std::vector<PausableMemory*> Memories() const;

  // Note [Views made late] (pause_late_views.cc). The thread's loop.
  void MapLateViewsWhenMade() ABSL_LOCKS_EXCLUDED(mu_);
  // After a pause that kept contents with views, in background mode: the
  // thread (started at the first) maps what it can once the pools are done.
  void ScheduleLateViewsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The thread stopped for good: joined (`at_exit`: waited for at most 2 s,
  // then left to the process's end: a pause stuck in the driver holds the
  // mutex it may wait for, and the exit must not hang on it).
  void StopLateViews(bool at_exit) ABSL_LOCKS_EXCLUDED(mu_);
  // mu_ for a pause or a resume, counted in `waiting_` while it waits, so
  // that the late views' thread lets it go first.
  class ABSL_SCOPED_LOCKABLE WaitingLock {
   public:
    explicit WaitingLock(PauseCoordinator* c) ABSL_EXCLUSIVE_LOCK_FUNCTION(c->mu_) : c_(c) {
      c_->waiting_.fetch_add(1, std::memory_order_relaxed);
      c_->mu_.Lock();
      c_->waiting_.fetch_sub(1, std::memory_order_relaxed);
    }
    ~WaitingLock() ABSL_UNLOCK_FUNCTION() { c_->mu_.Unlock(); }
    WaitingLock(const WaitingLock&) = delete;
    WaitingLock& operator=(const WaitingLock&) = delete;

   private:
    PauseCoordinator* const c_;
  };

  const DriverApi& driver_;
  HeapTable& heaps_;
  CaptureTracker& captures_;
  const int copy_threads_;
  const PinnedPoolOptions pinned_pool_options_;
  PausableMemory* const other_;
  const bool addressable_;
  std::vector<PauseParticipant*> participants_ ABSL_GUARDED_BY(mu_);
  // Kept from the first pause with contents on (core/heap/host_backup.h).
  StagingRing ring_ ABSL_GUARDED_BY(mu_);
  // Page-locked memory made ahead for kept contents (core/heap/pinned_pool.h).
  PinnedPool pool_;
  // Host VMM memory paused memory maps (core/heap/host_mapped_pool.h).
  HostMappedPools host_pools_;
  const bool host_memory_in_background_;
  Mutex mu_;  // lock order: "pause mutex"
  // Note [Views made late].
  std::atomic<int> waiting_{0};  // callers waiting for mu_ (WaitingLock)
  CondVar late_wanted_;          // late_pending_ set (the thread also looks every 100 ms)
  bool late_pending_ ABSL_GUARDED_BY(mu_) = false;
  // Set without the mutex (a stop must not wait for a pause that hangs); it
  // also raises waiting_ for good, so that a pass stops at its next check.
  std::atomic<bool> late_stopping_{false};
  std::atomic<bool> late_running_{false};  // the thread has not returned yet
  std::thread late_thread_;  // started by the first ScheduleLateViewsLocked
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_PAUSE_H_

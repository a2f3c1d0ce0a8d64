// The pause and resume of one heap arena's blocks: the arena's part of
// PausableMemory (core/heap/pausable_memory.h; the coordinator and the
// contract: core/heap/pause.h). A pause copies a block's contents to a host
// backup (core/heap/host_backup.h, core/heap/backup_copier.h) when asked,
// then unmaps and releases its physical memory while its VA stays the
// block's; a resume maps new memory at the same address with the access the
// block would have had, and copies the backup in.
//
// Units: bytes. Thread safety: each step takes the arena's mutex itself
// (Lock and Unlock are empty), so that frees in blocks being paused go on
// between the steps (a free in a `pausing` block still works).
#ifndef VMMSHIM_CORE_HEAP_ARENA_PAUSE_H_
#define VMMSHIM_CORE_HEAP_ARENA_PAUSE_H_

#include <cuda.h>

#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/heap/arena_blocks.h"
#include "core/heap/backup_copier.h"
#include "core/heap/pausable_memory.h"
#include "core/heap/tag_selection.h"

namespace vmmshim {

class HeapArena;

class ArenaPause final : public PausableMemory {
 public:
  // `arena` owns this and outlives it.
  explicit ArenaPause(HeapArena& arena) : arena_(arena) {}
  ArenaPause(const ArenaPause&) = delete;
  ArenaPause& operator=(const ArenaPause&) = delete;

  // `tag`: the blocks whose placement's tag it selects, stream-ordered
  // ones too (their freed blocks must have left the stream-ordered cache
  // first: StreamOrderedFrontEnd::ReleaseForPause). `times` (never null)
  // collects where the time went.
  //
  // The bytes of the live blocks a pause of `tag` would back up; their
  // contexts and their peers' (AddPeerContexts) are added to `contexts`
  // (once each).
  size_t PauseCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) override;
  // CUDA_ERROR_NOT_PERMITTED (and a log line naming it) when a block the
  // pause would select holds exported memory; nothing changes.
  absl::Status CheckPausable(const TagSelection& tag) const override;
  // Pause in two steps, so that a pause over several arenas and devices
  // either happens everywhere or nowhere. PausePrepare (the contexts
  // synchronized by the caller): with `copier`, every selected live block's
  // contents to a host backup (all backups made before any copy), and the
  // blocks marked `pausing`: no new allocation lands in them, a free in them
  // still works (Note [A block freed while its pause is under way], below).
  // On failure its own marks are undone. PauseAbort undoes the
  // marks (backups dropped). PauseCommit unmaps and releases the marked
  // blocks (the VA stays theirs), each once its copy is complete (Note [A
  // pause's memory goes as its copy completes], core/heap/pausable_memory.h:
  // it waits under the arena's mutex, so a free meanwhile waits too), and
  // releases the tag's cached memory; returns the physical bytes the driver
  // got back; a block whose copy or unmap fails stays live and the first
  // such error is returned after the rest.
  // With `views`, each paused block's address maps its view (MapViewLocked).
  //
  // Note [A block freed while its pause is under way]: between PausePrepare
  // and PauseCommit the arena's mutex is free (other memories prepare
  // meanwhile), and the block's copy may still be running on the copy
  // engine, reading its device memory into its backup. A free then is done
  // for the program (the pointer is unknown from then on, the live counts
  // drop) but the block stays, marked `freed_while_pausing`, neither
  // unmapped nor its backup given back: unmapping memory a copy is reading
  // faults the copy (and loses the context), and host memory given back
  // under a copy is written after its next owner got it. PauseCommit waits
  // for its copy and then releases it (its bytes counted as released);
  // PauseAbort, which runs after every copy was waited for, releases it too.
  absl::StatusOr<size_t> PausePrepare(const TagSelection& tag, BackupCopier* copier,
                                      PauseTimes* times) override;
  void PauseAbort(const TagSelection& tag) override;
  absl::StatusOr<size_t> PauseCommit(const TagSelection& tag, BackupCopier* copier,
                                     HostMappedPools* views, PauseTimes* times) override;
  // The contexts of the selected paused blocks that have a view, and their
  // peers' (AddPeerContexts).
  void ResumeCandidates(const TagSelection& tag, std::vector<CUcontext>* contexts) override;
  // Resume in two steps, likewise: Prepare maps new memory at each paused
  // block's address with the access it would have had (Target), unless a
  // failed undo left it mapped, and copies the backup in; Commit forgets the
  // backups; Abort unmaps and releases what is mapped (still paused,
  // backups kept; a mapping whose unmap fails stays for the next resume).
  // Prepare retries failed releases first and releases this arena's cache
  // once before failing with CUDA_ERROR_OUT_OF_MEMORY; on failure it undoes
  // what it mapped. Returns the bytes mapped.
  absl::StatusOr<size_t> ResumePrepare(const TagSelection& tag, BackupCopier& copier,
                                       HostMappedPools* views, PauseTimes* times) override;
  // `retain`: the blocks keep their backups (PauseCoordinator::Resume).
  void ResumeCommit(const TagSelection& tag, bool retain) override;
  void ResumeAbort(const TagSelection& tag, HostMappedPools* views) override;
  // Takes the arena's mutex block by block.
  size_t MapLateViews(HostMappedPools& views, const std::atomic<int>& waiting) override;

 private:
  // Whether `b` is selected by a pause or resume of `tag` (stream-ordered
  // blocks too: their freed ones left the stream-ordered cache first).
  static bool Selected(const Block& b, const TagSelection& tag) {
    return tag.Matches(b.placement.tag);
  }

  // Maps paused `b`'s view at `base` (Block::view) with read-write access
  // for `access` (or the owner's alone where a peer's is refused): its
  // backup's host VMM memory, or `views`' scratch when its contents were
  // dropped; nothing when they were kept in other host memory. A failure is
  // logged and leaves no view (an access faults).
  void MapViewLocked(CUdeviceptr base, Block& b, DeviceSet access, HostMappedPools& views);
  // Releases the block at `base`, freed while its pause was under way, its
  // copy complete: true when the driver took its memory back; otherwise it
  // (or its handle) is kept aside as a failed free's is, retried by Trim
  // (an unmap that fails is logged naming `tag`). The caller holds the
  // arena's mutex (HeapArena is incomplete here, so the analysis cannot
  // name it: the contract is the caller's, as MapViewAgainLocked's).
  bool ReleaseFreedLocked(const TagSelection& tag, CUdeviceptr base)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Adds the active primary context of each peer in `access` (a kernel
  // there may be reading the memory; a peer's other contexts are not seen),
  // once each.
  void AddPeerContexts(DeviceSet access, std::vector<CUcontext>* contexts) const;
  // Block `b` at `base`, still paused after a failed resume or its undo:
  // its view again (with the access its resume would have given), when
  // `views` and no device memory is mapped there. The caller holds the
  // arena's mutex and looked `b` up under it (HeapArena is incomplete
  // here, so the lock contract is the caller's).
  void MapViewAgainLocked(CUdeviceptr base, Block& b, HostMappedPools* views);

  HeapArena& arena_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_ARENA_PAUSE_H_

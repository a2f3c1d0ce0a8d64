// Page-locked host memory kept for the life of the process, so that a pause
// with contents runs at the copy engine's speed from its first cycle
// (VMMSHIM_PINNED_POOL; docs/pause-resume-design.md, "The pinned pool").
//
// Why a pool: the copy engine is fast to page-locked host memory, but making
// memory page-locked is several times slower than the copy, by every way
// the driver offers (docs/performance.md, "Measurements behind the design": "Pinning host memory"). So the pool is made before
// it is needed (the fastest way: new memory advised MADV_HUGEPAGE, first
// written by several threads, then registered; in the background from the
// first device allocation) and reused by every pause.
//
// Units: bytes. The pool is cut into ranges of kAlignment, handed out whole
// or not at all, and registered as chunks of `chunk_bytes` (1 GiB), each
// its own cuMemHostRegister: a copy may not span two registrations (the
// driver rejects it with CUDA_ERROR_INVALID_VALUE), so copies are cut at
// chunk ends (PinForCopy).
//
// Pinning given back across a deep sleep: the driver's process checkpoint
// unpins every registered range at the checkpoint and pins it again at the
// restore, whether a pause used it or not, which slows both (docs/performance.md, "Measurements behind the design":
// "The pinned pool across a checkpoint"). Unpin drops every chunk's
// registration (memory and contents stay) before the checkpoint; a chunk is
// registered again when a copy next needs it, just before that copy is
// queued, so that the registration of one chunk runs beside the copy of the
// one before. Unregistering does not hide behind copies so, and Unpin drops
// the registrations after the pause.

// Cost (documented for the user): `bytes` of host memory, page-locked (not
// swappable, counted in the process's resident set) from the fill to the
// end of the process; the fill's threads (the copy threads' number) exist
// only while it runs. The memory is MADV_DONTFORK: a fork's child gets none
// of it (the kernel would otherwise copy every pinned page at the fork) and
// has no pool.
//
// Errors: none are returned. A fill that fails (host memory, a memlock
// limit, the driver's refusal) is logged once and leaves the pool empty;
// pauses then make their copies as without it.
//
// Thread safety: every member may be called from any thread. Take waits
// while the fill runs (a few seconds for tens of GiB: docs/performance.md, "Measurements behind the design").
//
// At process exit the fill thread is joined by the destructor; the memory
// is unregistered (each chunk whose registration is still alive) and
// unmapped.
#ifndef VMMSHIM_CORE_HEAP_PINNED_POOL_H_
#define VMMSHIM_CORE_HEAP_PINNED_POOL_H_

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "core/base/host_memory.h"
#include "core/driver/driver_api.h"
#include "core/sync/mutex.h"

namespace vmmshim {

class PinnedPool {
 public:
  static constexpr size_t kAlignment = size_t{2} << 20;  // a huge page
  // What one cuMemHostRegister covers: the copies' parts are 1 GiB anyway
  // (BackupCopier::kCopyPartBytes), and 1 GiB registrations cost what one
  // registration of the whole does (bench/page_lock_speed, chunks_thp_T).
  static constexpr size_t kDefaultChunkBytes = size_t{1} << 30;

  // `driver` must outlive the pool.
  explicit PinnedPool(const DriverApi& driver) : driver_(driver) {}
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Makes the pool of `bytes` (rounded up to kAlignment) in the background,
  // filled by `threads` threads and registered (portable: usable from every
  // context) in `context` as chunks of `chunk_bytes` (rounded up to
  // kAlignment). At most 3/4 of the host memory left now
  // (core/base/host_memory.h: MemAvailable or the memory cgroup's
  // headroom): a larger `bytes` is cut to that, or the pool refused when
  // nothing is left, with a warning naming the limit. Once per pool: later
  // calls, `bytes` == 0 or a null context do nothing.
  void Start(size_t bytes, CUcontext context, int threads,
             size_t chunk_bytes = kDefaultChunkBytes);

  // What Start makes of a request of `bytes` with `headroom` left: `bytes`
  // when it fits in 3/4 of the headroom, else that much in whole
  // kAlignment units (0: refused).
  static size_t AllowedBytes(size_t bytes, const HostMemoryHeadroom& headroom);

  // A range of at least `bytes` (rounded up to kAlignment) of page-locked
  // memory, or nullptr when the pool was never started, failed, or has no
  // free range that large. Waits for a fill under way. The range is the
  // caller's until Give.
  char* Take(size_t bytes);
  // Gives back a range Take returned (`bytes` as asked of Take).
  void Give(char* range, size_t bytes);

  // Whether the pool can be used (made, not failed). Registrations that a
  // context's destruction (a cudaDeviceReset) dropped are marked so, to be
  // made again by PinForCopy.
  bool Usable();

  // Before a copy between the copy engine and [p, p + bytes) of a range
  // Take returned: registers the chunk that holds `p` when it is not (in
  // the current context), and returns how many bytes from `p` lie in that
  // one registration (at most `bytes`): the most one copy call may move.
  // The driver's error of the registration (nothing registered then).
  absl::StatusOr<size_t> PinForCopy(const char* p, size_t bytes);

  // Drops the registration of every chunk; the memory and what it holds
  // stay, and PinForCopy registers a chunk again when a copy needs it. For
  // the driver's process checkpoint (a deep sleep), with no copy to or
  // from the pool under way. The bytes that were registered.
  size_t Unpin();

  // Returns once no fill is under way (a program or test that wants the
  // pool made before its first pause).
  void AwaitFill();

  struct Stats {
    size_t bytes = 0;        // made and usable (0 while filling or failed)
    size_t free_bytes = 0;   // of it, not taken
    size_t pinned_bytes = 0;  // of it, registered now (Unpin gives it back)
    double fill_seconds = 0;
  };
  Stats stats() const;

  // A fork's child: the memory was not inherited (MADV_DONTFORK).
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  enum class State { kNone, kFilling, kReady, kFailed };
  void Fill(size_t bytes, CUcontext context, int threads, size_t chunk_bytes);
  size_t ChunkSize(size_t k) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::min(chunk_bytes_, bytes_ - k * chunk_bytes_);
  }
  void AwaitFillLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (state_ == State::kFilling) filled_.Wait(&mu_);
  }

  const DriverApi& driver_;
  mutable Mutex mu_;
  CondVar filled_;  // signalled when a fill ends
  State state_ ABSL_GUARDED_BY(mu_) = State::kNone;
  char* memory_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t chunk_bytes_ ABSL_GUARDED_BY(mu_) = kDefaultChunkBytes;
  // Per chunk: the context its registration was made in; null: not
  // registered.
  std::vector<CUcontext> registered_in_ ABSL_GUARDED_BY(mu_);
  double fill_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // Free ranges: offset -> bytes, coalesced on Give.
  std::map<size_t, size_t> free_ ABSL_GUARDED_BY(mu_);
  std::thread filler_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_PINNED_POOL_H_

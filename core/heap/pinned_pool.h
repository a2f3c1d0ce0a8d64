// Page-locked host memory kept for the life of the process, so that a pause
// with contents runs at the copy engine's speed from its first cycle
// (VMMSHIM_PINNED_POOL; docs/pause-resume.md, "The pinned pool").
//
// Why a pool: the copy engine moves 51 GiB/s each way between the H200 and
// page-locked host memory, but making memory page-locked is the slow part
// (bench/page_lock_speed, docs/data/page-lock-speed-h200.csv, 16 GiB):
// cuMemHostRegister of new 4 KiB pages 2.3-2.4 GiB/s, cuMemHostAlloc
// 1.8 GiB/s, host memory of cuMemCreate 3.6-3.7 GiB/s; new memory advised
// MADV_HUGEPAGE, first written by 16 threads and then registered, 15-18 GiB/s.
// No way of pinning at pause time reaches 40 GiB/s, so the pool is made
// before it is needed (the fastest way above, in the background from the
// first device allocation) and reused by every pause.
//
// Units: bytes. The pool is one registration (a copy may not span two
// registrations: the driver rejects it with CUDA_ERROR_INVALID_VALUE), cut
// into ranges of kAlignment; a range is handed out whole or not at all.
//
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
// while the fill runs (it progresses at 15+ GiB/s, so a 32 GiB pool keeps a
// pause waiting at most about 2 s).
//
// At process exit the fill thread is joined by the destructor; the memory
// is unregistered (when the registration is still alive) and unmapped.
#ifndef VMMSHIM_CORE_HEAP_PINNED_POOL_H_
#define VMMSHIM_CORE_HEAP_PINNED_POOL_H_

#include <cuda.h>

#include <cstddef>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "core/driver/driver_api.h"
#include "core/sync/mutex.h"

namespace vmmshim {

class PinnedPool {
 public:
  static constexpr size_t kAlignment = size_t{2} << 20;  // a huge page

  // `driver` must outlive the pool.
  explicit PinnedPool(const DriverApi& driver) : driver_(driver) {}
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Makes the pool of `bytes` (rounded up to kAlignment) in the background,
  // registered (portable: usable from every context) in `context`, filled
  // by `threads` threads. Once per pool: later calls, `bytes` == 0 or a null
  // context do nothing.
  void Start(size_t bytes, CUcontext context, int threads);

  // A range of at least `bytes` (rounded up to kAlignment) of page-locked
  // memory, or nullptr when the pool was never started, failed, or has no
  // free range that large. Waits for a fill under way. The range is the
  // caller's until Give.
  char* Take(size_t bytes);
  // Gives back a range Take returned (`bytes` as asked of Take).
  void Give(char* range, size_t bytes);

  // Whether the registration is alive: a context's destruction (a
  // cudaDeviceReset) drops it; then it is made again in the current
  // context, once per call (the cost of pinning once more). false: no
  // usable pool (none, failed, or the registration could not be made again).
  bool EnsureRegistered();

  // Returns once no fill is under way (a program or test that wants the
  // pool made before its first pause).
  void AwaitFill();

  struct Stats {
    size_t bytes = 0;        // page-locked and usable (0 while filling or failed)
    size_t free_bytes = 0;   // of it, not taken
    double fill_seconds = 0;
  };
  Stats stats() const;

  // A fork's child: the memory was not inherited (MADV_DONTFORK).
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  enum class State { kNone, kFilling, kReady, kFailed };
  void Fill(size_t bytes, CUcontext context, int threads);
  void AwaitFillLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (state_ == State::kFilling) filled_.Wait(&mu_);
  }

  const DriverApi& driver_;
  mutable Mutex mu_;
  CondVar filled_;  // signalled when a fill ends
  State state_ ABSL_GUARDED_BY(mu_) = State::kNone;
  char* memory_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  CUcontext context_ ABSL_GUARDED_BY(mu_) = nullptr;  // of the registration
  double fill_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // Free ranges: offset -> bytes, coalesced on Give.
  std::map<size_t, size_t> free_ ABSL_GUARDED_BY(mu_);
  std::thread filler_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_PINNED_POOL_H_

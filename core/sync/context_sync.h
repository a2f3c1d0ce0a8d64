// Combined context synchronization for frees (group commit).
//
// A free must wait for the owning context's work (cuMemFree does;
// cuMemUnmap does not: CUDA Programming Guide 4.16) before its memory is reused.
// The driver serializes cuCtxSynchronize across threads: several threads
// together synchronize barely faster than one (docs/performance.md, "Measurements behind the design": "Context
// synchronize"). One synchronize per free would cap every multi-threaded
// program's frees at that rate.
//
// The rule that lets frees share one: cuCtxSynchronize "blocks until the
// device has completed all preceding requested tasks" (driver API,
// cuCtxSynchronize), so a synchronize of context C that *starts* after a
// free of C was called covers all work that was queued before that free, by
// any thread. Synchronize(C) therefore returns once a synchronize of C that
// began after the call has completed: when none is running it runs one
// itself; when one is running (begun before this call, so it does not count)
// it waits for the next, which one of the waiting callers runs and which
// covers them all. One thread alone pays one synchronize per call, as
// before.
//
// Result: the status of the synchronize that covered the call (the driver's
// code, e.g. a sticky CUDA_ERROR_ILLEGAL_ADDRESS, reaches every free it
// covered; a covered caller gets the code, named "cuCtxSynchronize").
//
// Capacity: kSlots contexts get combining (a slot is claimed on a context's
// first free and kept: a handle reused by a later context keeps the slot,
// which is harmless); beyond that, Synchronize calls the function directly.
// Thread safety: any thread; lock-free apart from the waiting: a caller
// that needs a synchronize that another is running spins (a synchronize
// lasts about a microsecond), then yields its CPU between checks. No mutex:
// a contended one puts every free to sleep in the kernel (seen on the H200:
// medians of 7 us per operation at eight threads).
#ifndef VMMSHIM_CORE_SYNC_CONTEXT_SYNC_H_
#define VMMSHIM_CORE_SYNC_CONTEXT_SYNC_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace vmmshim {

class SyncCombiner {
 public:
  static constexpr int kSlots = 64;
  using SyncFn = std::function<absl::Status(CUcontext)>;

  // `sync` synchronizes one context (called without any lock of this class).
  explicit SyncCombiner(SyncFn sync) : sync_(std::move(sync)) {}
  SyncCombiner(const SyncCombiner&) = delete;
  SyncCombiner& operator=(const SyncCombiner&) = delete;

  // Returns once a synchronize of `context` that began after this call has
  // completed (header comment), with that synchronize's status.
  absl::Status Synchronize(CUcontext context);

  // How many synchronizes ran, and how many calls were answered by one that
  // another caller ran (for tests and the statistics).
  uint64_t synchronizes() const { return synchronizes_.load(std::memory_order_relaxed); }
  uint64_t shared() const { return shared_.load(std::memory_order_relaxed); }

  void AfterForkChild();

 private:
  // Arrivals write `started` (every free); waiters poll `finished`: kept on
  // cache lines of their own so the polling does not slow the numbering.
  struct alignas(64) Slot {
    std::atomic<CUcontext> context{nullptr};
    std::atomic<uint64_t> started{0};    // synchronizes begun
    alignas(64) std::atomic<bool> running{false};  // a caller is synchronizing
    std::atomic<uint64_t> finished{0};   // the last one completed
    std::atomic<int> result{0};          // its CUresult
  };
  // The slot of `context`, claimed on first use; nullptr when all are taken.
  Slot* SlotFor(CUcontext context);

  SyncFn sync_;
  std::array<Slot, kSlots> slots_;
  std::atomic<uint64_t> synchronizes_{0}, shared_{0};
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SYNC_CONTEXT_SYNC_H_

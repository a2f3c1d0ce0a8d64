// The local memory a context reserves for its threads' stacks, given back for
// a deep sleep and taken again at the wake.
//
// A context reserves device memory for the call stack of every thread the
// GPU can hold resident: CU_LIMIT_STACK_SIZE bytes per thread (1 KiB by
// default) times the device's resident threads (CUDA Driver API, cuCtxSetLimit:
// "CU_LIMIT_STACK_SIZE controls the stack size in bytes of each GPU thread").
// That is about half of what a bare context holds, and the driver's process
// checkpoint copies it with the rest of the context: lowering the limit to 0
// first cuts the checkpoint of a context by a third or more, and setting it
// back is quick (docs/performance.md, "Measurements behind the design": "The stack reservation"). Only the limit is lowered,
// between a sleep's pause and its checkpoint; the wake's Restore puts the
// exact value back before it resumes the memory, so a kernel can meet the
// low limit only in the window where it would also meet paused memory
// (docs/deep-sleep-design.md, "The race of an external sleep").
//
// Release covers the active primary context of every device (what cudart
// and PyTorch use); contexts made with cuCtxCreate keep their limit.
//
// Errors: Release returns the first driver error after setting back what it
// had lowered (all or nothing; the sleep goes on without it: this only makes
// the checkpoint shorter). Restore tries every context it lowered and returns
// the first error, keeping the ones that failed for the next Restore (a wake
// that found the GPU full: the next wake tries again). Both return OK, doing
// nothing, when the driver lacks cuCtxGetLimit or cuCtxSetLimit.
//
// Thread safety: Release and Restore may be called from any thread, one at a
// time or concurrently (one mutex). Process exit: nothing is restored; the
// contexts go with the process.
#ifndef VMMSHIM_CORE_LIFECYCLE_STACK_RESERVATION_H_
#define VMMSHIM_CORE_LIFECYCLE_STACK_RESERVATION_H_

#include <cuda.h>

#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/driver/driver_api.h"

namespace vmmshim {

class StackReservation {
 public:
  // `driver` must outlive this object.
  explicit StackReservation(const DriverApi& driver) : driver_(driver) {}

  // Records each active primary context's CU_LIMIT_STACK_SIZE and sets it to
  // 0 (contexts already lowered and not yet restored are left as they are).
  // *lowered (optional) receives the number of contexts lowered by this call.
  absl::Status Release(int* lowered = nullptr);

  // Sets every lowered context's limit back to its recorded value.
  // *restored (optional) receives the number set back by this call.
  absl::Status Restore(int* restored = nullptr);

  // Contexts lowered and not yet restored.
  int lowered() const;

 private:
  struct Lowered {
    CUcontext context;
    size_t stack_bytes;  // the limit before Release
  };

  // Sets `context`'s stack limit to `bytes`, making it current for the call.
  CUresult SetStackLimit(CUcontext context, size_t bytes) const;

  const DriverApi& driver_;
  mutable absl::Mutex mu_;
  std::vector<Lowered> lowered_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_LIFECYCLE_STACK_RESERVATION_H_

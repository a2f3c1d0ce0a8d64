// The current context and its device, and context synchronization, as every
// room of core/ asks for them.
//
// CurrentContext calls cuCtxGetCurrent every time (a thread-local read in the
// driver; contexts change through paths the shim does not see, such as
// cudart's own primary-context handling), and cuCtxGetDevice only for a
// context the calling thread has not met since the last ForgetContexts: a
// cache hit then makes no further driver call. A context handle names one
// device for its whole life, but a destroyed context's handle can be reused
// by a new context on another device, hence ForgetContexts.
//
// Thread safety: any thread; the memo is per thread, the epoch one atomic.
#ifndef VMMSHIM_CORE_DRIVER_CONTEXT_H_
#define VMMSHIM_CORE_DRIVER_CONTEXT_H_

#include <cuda.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/driver/driver_api.h"

namespace vmmshim {

// The current context and its device; false when none is current or the
// driver cannot say (the caller hands the request to the driver, which
// reports its own error).
bool CurrentContext(const DriverApi& driver, CUcontext* context, int* device);

// A context was destroyed or reset (or a new allocator starts): every thread
// asks the driver again about the contexts it meets, and ContextEpoch moves.
void ForgetContexts();
// Moves with every ForgetContexts; memos of other handles derived from
// contexts (streams) compare it.
uint64_t ContextEpoch();

// cuCtxSynchronize of `context`, which need not be current (cuCtxSynchronize_v2
// where the driver has it, else a push, synchronize and pop). The driver's
// code as a status (core/driver/cu_status.h).
absl::Status SynchronizeContext(const DriverApi& driver, CUcontext context);

// The primary context of `device` when it is active, leaving its reference
// count as it was (one cuDevicePrimaryCtxRetain, one Release); nullptr when
// it is inactive, when a query fails, or when the driver lacks
// cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxRetain or
// cuDevicePrimaryCtxRelease_v2 (then nothing of it can be held).
CUcontext ActivePrimaryContext(const DriverApi& driver, CUdevice device);

// Makes `context` current for the scope when it is not (events belong to
// the context current at their creation; CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD name a stream of the current context).
class ContextScope {
 public:
  ContextScope(const DriverApi& driver, CUcontext context) : driver_(driver) {
    CUcontext current = nullptr;
    if (context == nullptr || driver_.cuCtxGetCurrent(&current) != CUDA_SUCCESS ||
        current == context) {
      return;
    }
    pushed_ = driver_.cuCtxPushCurrent_v2(context) == CUDA_SUCCESS;
  }
  ~ContextScope() {
    if (!pushed_) return;
    CUcontext popped = nullptr;
    driver_.cuCtxPopCurrent_v2(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const DriverApi& driver_;
  bool pushed_ = false;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_DRIVER_CONTEXT_H_

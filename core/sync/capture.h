// Stream captures in progress (CaptureTracker), and the rules every room of
// the shim follows while one is, told once here:
//
// Note [Calls during a stream capture]: the driver prohibits "potentially
// unsafe API calls" during a capture, depending on the capture mode of the
// capture and of the calling thread (CUDA driver API, cuStreamBeginCapture
// and cuThreadExchangeStreamCaptureMode). Measured on H200 (driver 13.0,
// examples/parity_probe.cu), for cuMemAlloc, cuMemAllocPitch and cuMemFree:
//   - global mode, from any thread, and thread-local mode from the capturing
//     thread: the call returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)
//     and the capture is invalidated (its end returns 901). cuMemFree(0)
//     and cuMemAlloc(&p, 0) behave the same there;
//   - otherwise (relaxed mode; thread-local mode from another thread): the
//     calls succeed and the capture goes on; cuMemFree(0) returns 0 and
//     does nothing.
// What the shim does, so that a program sees the driver's codes exactly:
//   1. Allocation and free ask cuMemFree(0) first, an exact probe (it fails,
//      and invalidates, iff the program's own call would have), only while
//      a capture is in progress: the common path pays one atomic load.
//   2. A context with a capturing stream cannot be synchronized
//      (cuCtxSynchronize fails and invalidates the capture, in relaxed mode
//      too), so a free allowed during a capture is deferred: the allocation
//      is gone for the program, its memory neither reused nor unmapped until
//      a synchronization after the last capture ends (HeapArena::DeferFree,
//      HeapTable::ReclaimDeferred, Allocator::CaptureEnded).
//   3. cuMemFreeAsync on the capturing stream itself is
//      CUDA_ERROR_INVALID_VALUE, the capture going on (a graph frees only
//      graph allocations); stream-ordered allocation on a capturing stream
//      is the driver's (graph memory nodes).
//   4. What must synchronize or copy (a pause, a resume, a sleep's quiesce)
//      is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture
//      untouched; the capture gate, held shared from that check to the end,
//      keeps a capture from beginning meanwhile.
//
// Note [The shim's own threads and captures]: in global mode a capture
// prohibits potentially unsafe calls from every thread whose own capture
// interaction mode is not RELAXED (cuThreadExchangeStreamCaptureMode), and
// such a call invalidates the program's capture. The shim's background
// threads (the host pools' maker and trimmer, the views made late, the
// pinned pool's filler) make VMM and page-locking calls whenever their work
// is there, whatever the program captures; which of those calls the driver
// counts as unsafe is not measured. So each such thread sets its own mode to
// RELAXED when it starts (RelaxCaptureModeOfThisThread): its calls neither
// fail nor invalidate anything, and the program's captures are untouched.
// The residency report's driver queries (a `vmmshim ps` during a capture)
// run relaxed for their length (ScopedRelaxedCaptureMode).
// Those threads never synchronize or query the program's streams, which no
// mode allows during a capture.
//
// Thread safety: all methods may be called from any thread. Lock order: the
// gate first (before any allocator lock), then the tracker's own mutex.
#ifndef VMMSHIM_CORE_SYNC_CAPTURE_H_
#define VMMSHIM_CORE_SYNC_CAPTURE_H_

#include <cuda.h>

#include <optional>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/driver/driver_api.h"
#include "core/sync/mutex.h"
#include "core/sync/shared_gate.h"

namespace vmmshim {

// Note [The shim's own threads and captures]: the calling thread's capture
// interaction mode becomes CU_STREAM_CAPTURE_MODE_RELAXED, for the rest of
// its life. A driver without cuThreadExchangeStreamCaptureMode (before CUDA
// 10.1) leaves it as it was. Call it first thing on a thread of the shim's.
void RelaxCaptureModeOfThisThread(const DriverApi& driver);

// The same for a scope, on any thread (the program's included): the
// thread's mode is relaxed from construction and given back at
// destruction. For driver queries the shim makes on a thread it does not
// own (the residency report's, from the control socket or the program).
class ScopedRelaxedCaptureMode {
 public:
  explicit ScopedRelaxedCaptureMode(const DriverApi& driver);
  ~ScopedRelaxedCaptureMode();
  ScopedRelaxedCaptureMode(const ScopedRelaxedCaptureMode&) = delete;
  ScopedRelaxedCaptureMode& operator=(const ScopedRelaxedCaptureMode&) = delete;

 private:
  const DriverApi& driver_;
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged_ = false;
};

class CaptureTracker {
 public:
  // `driver` must outlive the tracker.
  explicit CaptureTracker(const DriverApi& driver) : driver_(driver) {}

  // Calls `begin` (the driver's cuStreamBeginCapture* with the caller's
  // arguments) and, when it succeeds, notes a capture on `stream`
  // (`per_thread`: through a _ptsz entry point). Holds the gate exclusively
  // across the call: a capture cannot begin between the shim's decision that
  // none is in progress and the synchronize that decision allowed (Free).
  template <typename Begin>
  CUresult BeginCapture(CUstream stream, bool per_thread, Begin begin) ABSL_LOCKS_EXCLUDED(gate_) {
    GateWriterLock lock(&gate_);
    CUresult r = begin();
    if (r == CUDA_SUCCESS) Began(stream, per_thread);
    return r;
  }
  // A capture sequence began on `stream` (the driver accepted
  // cuStreamBeginCapture*); `per_thread`: through a _ptsz entry point.
  void Began(CUstream stream, bool per_thread) ABSL_LOCKS_EXCLUDED(mu_);
  // Held shared by a caller from its check of any() to the end of the
  // synchronize it makes when any() was false; see BeginCapture.
  // Its read side costs a free one counter of its own thread slot
  // (core/sync/shared_gate.h).
  SharedGate& gate() ABSL_LOCK_RETURNED(gate_) { return gate_; }
  // cuStreamEndCapture(stream) returned: the capture is forgotten once the
  // driver no longer reports the stream as capturing (begun and ended
  // through either entry point). The caller holds the gate exclusively
  // (Allocator::CaptureEnded).
  void Ended(CUstream stream, bool per_thread) ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether any capture is in progress (one atomic load). Captures that
  // ended without passing through Ended (their stream was destroyed) are
  // forgotten by Refresh.
  bool any() const { return active_.load(std::memory_order_acquire) > 0; }
  // Re-asks the driver about every capture this thread can ask about.
  void Refresh() ABSL_LOCKS_EXCLUDED(mu_);

  // cuStreamIsCapturing(_ptsz) of `stream`: true or false, nullopt when the
  // driver cannot say (no such entry point, or an error: a destroyed or
  // invalid stream). No lock.
  std::optional<bool> IsCapturing(CUstream stream, bool per_thread) const;

  // The driver's verdict on a potentially unsafe call from this thread now:
  // CUDA_SUCCESS, or the code (and capture invalidation) the driver gives
  // such a call (header comment).
  CUresult ProbeUnsafeCall() const;

  // fork(): the gate is taken first of all the allocator's locks, the
  // tracker's own mutex last (the lock order); released in reverse.
  void PrepareForkGate() ABSL_NO_THREAD_SAFETY_ANALYSIS { gate_.Lock(); }
  void PrepareForkState() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void AfterForkParentState() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  void AfterForkParentGate() ABSL_NO_THREAD_SAFETY_ANALYSIS { gate_.Unlock(); }
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  struct Capture {
    CUstream stream;
    bool per_thread;
    std::thread::id thread;  // a per-thread stream handle means this thread's
  };
  // Whether the driver still reports `c` as capturing; asks only about
  // streams this thread can name.
  bool StillCapturing(const Capture& c) const;

  const DriverApi& driver_;
  std::atomic<int> active_{0};
  SharedGate gate_;  // lock order: "capture gate" (core/sync/lock_order.h)
  Mutex mu_ ABSL_ACQUIRED_AFTER(gate_);  // "capture state mutex"
  std::vector<Capture> captures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SYNC_CAPTURE_H_

// Quiescing a process's GPU work before a pause it is not in control of
// (docs/pause-resume.md, "Quiescing"): the submission gate closes
// (core/sync/submission_gate.h), the calls already inside the driver
// return, then every active primary context is synchronized, so that no
// work of the program runs, or can start, while memory is unmapped.
//
// Steps of Quiesce, each bounded by the timeout; a step that runs out opens
// the gate again (undone, the program goes on) and says why:
//   1. refuse during a stream capture (Note [Calls during a stream capture],
//      core/sync/capture.h, item 4);
//   2. close the gate;
//   3. wait for the gated calls still inside the driver (a launch returns in
//      microseconds; a synchronous copy after the work queued before it):
//      CUDA_ERROR_TIMEOUT naming each thread and entry point still inside;
//   4. synchronize the active primary context of every device, on a thread
//      of its own so that a synchronize that never ends (a kernel waiting
//      for a host write that a held thread would make; a host function
//      calling a gated entry point from a graph, which the gate cannot
//      tell from the program) cannot hang the caller: CUDA_ERROR_TIMEOUT
//      naming the device; a driver error is returned as such (a lost
//      context: its sticky code). Host functions that the driver runs
//      meanwhile pass the gate (interpose/hooks_submission.cc marks them);
//      when one submitted work, the contexts are synchronized again.
//      Only primary contexts: the pause then synchronizes the contexts that
//      own the memory it takes (core/heap/pause.h), created ones included.
// On success the gate stays closed until Release.
//
// Thread safety: Quiesce and Release are serialized by the caller
// (core/sleep/sleep_coordinator.h). The timeout is VMMSHIM_QUIESCE_TIMEOUT
// (docs/configuration.md).
#ifndef VMMSHIM_CORE_SLEEP_WORK_QUIESCER_H_
#define VMMSHIM_CORE_SLEEP_WORK_QUIESCER_H_

#include <chrono>
#include <cstdint>

#include "absl/status/status.h"
#include "core/driver/driver_api.h"
#include "core/sync/capture.h"
#include "core/sync/submission_gate.h"

namespace vmmshim {

class WorkQuiescer {
 public:
  // Everything referenced must outlive the quiescer.
  WorkQuiescer(const DriverApi& driver, SubmissionGate& gate, CaptureTracker& captures,
               std::chrono::milliseconds timeout);
  WorkQuiescer(const WorkQuiescer&) = delete;
  WorkQuiescer& operator=(const WorkQuiescer&) = delete;

  // The steps of the header comment. OK: the gate is closed to every thread
  // but the caller's, and no work of the program runs.
  absl::Status Quiesce();
  // Opens the gate: the held threads go on.
  void Release() { gate_.Open(); }
  bool quiesced() const { return gate_.closed(); }
  SubmissionGate& gate() { return gate_; }

 private:
  // Step 4: synchronizes every active primary context within `deadline`,
  // again while host functions passed the gate since `passes` was taken.
  absl::Status SynchronizeContexts(std::chrono::steady_clock::time_point deadline,
                                   uint64_t passes);

  const DriverApi& driver_;
  SubmissionGate& gate_;
  CaptureTracker& captures_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SLEEP_WORK_QUIESCER_H_

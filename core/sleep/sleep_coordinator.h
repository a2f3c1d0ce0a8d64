// The one owner of the pauses the program is not in control of and of the
// deep sleep's steps in the process (docs/pause-resume.md, "Quiescing";
// docs/deep-sleep.md): the C and Python APIs' pause and resume
// (interpose/api.cc) and the control socket's sleep and wake
// (core/control/control_server.h, wired by interpose/runtime.cc) call it.
//
// Pause: unless the caller says it is the only thread that submits work
// (`sole_submitter`: the hot RL loop, where the quiesce must cost nothing),
// the program's GPU work is quiesced first (core/sleep/work_quiescer.h),
// then the memory is paused (core/heap/pause.h). For a pause of every
// allocation the gate then stays closed until a resume brings everything
// back (of every allocation, or tag after tag until nothing is paused):
// another thread's launch would otherwise meet unmapped memory and lose the
// context (the caller's own thread passes). A thread the program waits on
// and that launches meanwhile waits too: that wait is the program's
// (docs/pause-resume.md, "Quiescing", says which patterns meet it). For a pause of
// some tags it opens again once the pause is done: the program's other
// threads go on, and those that use the paused tags are the program's
// own race, as without the shim's gate.
// Sleep (the deep sleep's steps before the driver's checkpoint, which an
// outside helper runs: cli/sleep_command.h): refused while the program
// holds a pause of everything of its own (CUDA_ERROR_ILLEGAL_STATE); quiesce, pause the `drop` tags
// without contents and everything else with them, give the pinned pool's
// pinning back, lower the contexts' stack limit; all or nothing (a failed
// step resumes what the sleep paused and opens the gate). The gate stays
// closed until Wake: the driver's lock blocks the program's calls only
// from the lock on, and a thread must not launch between the pause and it.
// Wake: the stack limit back, everything resumed, the gate opened; a failed
// resume keeps everything paused and the gate closed (a later wake can
// succeed).
//
// Errors: the quiescer's (CUDA_ERROR_TIMEOUT, naming what did not finish;
// during a stream capture, Note [Calls during a stream capture] in
// core/sync/capture.h, item 4), then those of PauseCoordinator.
// Thread safety: every method from any thread, serialized (lock order:
// "sleep coordinator mutex", first of all). Process exit: nothing; a held
// thread ends with the process.
#ifndef VMMSHIM_CORE_SLEEP_SLEEP_COORDINATOR_H_
#define VMMSHIM_CORE_SLEEP_SLEEP_COORDINATOR_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "core/heap/host_backup.h"
#include "core/heap/pause.h"
#include "core/heap/tag_selection.h"
#include "core/history/memory_history.h"
#include "core/lifecycle/stack_reservation.h"
#include "core/sleep/work_quiescer.h"
#include "core/sync/mutex.h"

namespace vmmshim {

class SleepCoordinator {
 public:
  // Everything referenced must outlive the coordinator; `stack` and
  // `history` may be nullptr (no stack lowering; no history records).
  SleepCoordinator(PauseCoordinator& pause, WorkQuiescer& quiescer, StackReservation* stack,
                   MemoryHistory* history);
  SleepCoordinator(const SleepCoordinator&) = delete;
  SleepCoordinator& operator=(const SleepCoordinator&) = delete;

  // The physical bytes released (PauseCoordinator::Pause).
  absl::StatusOr<size_t> Pause(const TagSelection& selection, bool keep_contents,
                               const BackupKind& kind, bool sole_submitter)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The bytes restored (PauseCoordinator::Resume).
  absl::StatusOr<size_t> Resume(const TagSelection& selection, bool retain_contents)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The bytes released for the sleep.
  absl::StatusOr<size_t> Sleep(const std::vector<std::string>& drop) ABSL_LOCKS_EXCLUDED(mu_);
  // The bytes restored.
  absl::StatusOr<size_t> Wake() ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the gate holds the program's other threads until a resume of
  // everything or a wake.
  bool holding() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<size_t> PauseRecorded(const TagSelection& selection, bool keep_contents,
                                       const BackupKind& kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<size_t> ResumeRecorded(const TagSelection& selection, bool retain_contents)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Record(HistoryAction action, const TagSelection& selection, size_t bytes) const;
  // All or nothing: what a sleep paused is resumed, and the gate opened when
  // the sleep closed it; returns `failed`.
  absl::Status UndoSleep(absl::Status failed, bool quiesced) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives the contexts' stack and the pinned pool's pinning back before a
  // checkpoint; each is logged and the sleep goes on without it.
  void ReleaseForCheckpoint() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  PauseCoordinator& pause_;
  WorkQuiescer& quiescer_;
  StackReservation* const stack_;
  MemoryHistory* const history_;
  mutable Mutex mu_;  // lock order: "sleep coordinator mutex"
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SLEEP_SLEEP_COORDINATOR_H_

#include "core/sleep/sleep_coordinator.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/base/log.h"
#include "core/driver/cu_status.h"

namespace vmmshim {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

SleepCoordinator::SleepCoordinator(PauseCoordinator& pause, WorkQuiescer& quiescer,
                                   StackReservation* stack, MemoryHistory* history)
    : pause_(pause), quiescer_(quiescer), stack_(stack), history_(history) {}

void SleepCoordinator::Record(HistoryAction action, const TagSelection& selection,
                              size_t bytes) const {
  if (history_ == nullptr || !history_->enabled()) return;
  HistoryRecord r;
  r.action = action;
  const std::string described = selection.Describe();
  r.tag = described;
  r.size = bytes;
  history_->Record(r);
}

absl::StatusOr<size_t> SleepCoordinator::PauseRecorded(const TagSelection& selection,
                                                       bool keep_contents,
                                                       const BackupKind& kind) {
  Record(HistoryAction::kPauseBegin, selection, 0);
  absl::StatusOr<size_t> released = pause_.Pause(selection, keep_contents, kind);
  Record(HistoryAction::kPauseEnd, selection, released.ok() ? *released : 0);
  return released;
}

absl::StatusOr<size_t> SleepCoordinator::ResumeRecorded(const TagSelection& selection,
                                                        bool retain_contents) {
  Record(HistoryAction::kResumeBegin, selection, 0);
  absl::StatusOr<size_t> restored = pause_.Resume(selection, retain_contents);
  Record(HistoryAction::kResumeEnd, selection, restored.ok() ? *restored : 0);
  return restored;
}

absl::StatusOr<size_t> SleepCoordinator::Pause(const TagSelection& selection, bool keep_contents,
                                               const BackupKind& kind, bool sole_submitter) {
  MutexLock lock(&mu_);
  // Held already (a pause of everything, a sleep): no other thread submits.
  const bool quiesce = !sole_submitter && !quiescer_.quiesced();
  if (quiesce) {
    if (absl::Status quiet = quiescer_.Quiesce(); !quiet.ok()) return quiet;
  }
  absl::StatusOr<size_t> released = PauseRecorded(selection, keep_contents, kind);
  if (quiesce) {
    if (released.ok() && selection.all()) {
      holding_ = true;
      Log().info("the program's other threads' GPU work waits for the resume of everything");
    } else {
      quiescer_.Release();
    }
  }
  return released;
}

absl::StatusOr<size_t> SleepCoordinator::Resume(const TagSelection& selection,
                                                bool retain_contents) {
  MutexLock lock(&mu_);
  absl::StatusOr<size_t> restored = ResumeRecorded(selection, retain_contents);
  // Everything is back (at once, or tag after tag): nothing a held thread
  // could touch is paused.
  if (restored.ok() && holding_ && (selection.all() || pause_.paused_bytes() == 0)) {
    holding_ = false;
    quiescer_.Release();
  }
  return restored;
}

void SleepCoordinator::ReleaseForCheckpoint() {
  // The driver's checkpoint would unpin the pinned pool and its restore pin
  // it again: given back here, pinned again by the wake's copies as they go
  // (core/heap/pinned_pool.h).
  const auto start = std::chrono::steady_clock::now();
  if (size_t unpinned = pause_.UnpinPinnedPool(); unpinned > 0) {
    Log().info("pinned pool: {} bytes unpinned for the checkpoint in {:.3f} s", unpinned,
               SecondsSince(start));
  }
  // The contexts' stack reservation, which the checkpoint would copy
  // (core/lifecycle/stack_reservation.h; VMMSHIM_SLEEP_LOWERS_STACK=0: none).
  int lowered = 0;
  absl::Status stack = stack_ == nullptr ? absl::OkStatus() : stack_->Release(&lowered);
  if (!stack.ok()) {
    Log().warn("the contexts' stack reservation stays for the checkpoint: {}",
               std::string(stack.message()));
  } else if (lowered > 0) {
    Log().info("stack limit of {} context(s) lowered for the checkpoint", lowered);
  }
}

absl::StatusOr<size_t> SleepCoordinator::Sleep(const std::vector<std::string>& drop) {
  MutexLock lock(&mu_);
  // The program holds its own pause of everything: its thread passes the
  // gate, and its resume would take back what the sleep paused.
  if (holding_) {
    return Reworded(DriverError(CUDA_ERROR_ILLEGAL_STATE, "sleep"),
                    "the program holds a pause of everything of its own (vmmshim.pause()); "
                    "resume it before the sleep");
  }
  const bool quiesce = !quiescer_.quiesced();
  if (quiesce) {
    if (absl::Status quiet = quiescer_.Quiesce(); !quiet.ok()) return quiet;
  }
  // Nothing runs from the checkpoint to the wake, so nothing could touch
  // paused memory: the sleep maps no host memory there (BackupKind::addressable)
  // and its copies take the pinned pool, whose pinning the checkpoint gets back.
  BackupKind kind;
  kind.addressable = false;
  size_t released = 0;
  for (const std::string& tag : drop) {
    absl::StatusOr<size_t> n = PauseRecorded(TagSelection::Only(tag), false, kind);
    if (!n.ok()) return UndoSleep(n.status(), quiesce);
    released += *n;
  }
  absl::StatusOr<size_t> n = PauseRecorded(TagSelection::All(), true, kind);
  if (!n.ok()) return UndoSleep(n.status(), quiesce);
  released += *n;
  // Host VMM memory, the kept and the scratch, must all go before the
  // checkpoint: Note [The driver's checkpoint and host VMM memory]
  // (core/heap/host_mapped_pool.h). Unused while asleep (the sleep maps
  // none); made again by the first pause after the wake.
  absl::StatusOr<size_t> host = pause_.ReleaseHostMemoryForCheckpoint();
  if (!host.ok()) return UndoSleep(host.status(), quiesce);
  if (*host > 0) {
    Log().info("host memory for paused contents: {} bytes released for the checkpoint", *host);
  }
  ReleaseForCheckpoint();
  holding_ = true;
  return released;
}

absl::Status SleepCoordinator::UndoSleep(absl::Status failed, bool quiesced) {
  ResumeRecorded(TagSelection::All(), false).IgnoreError();
  if (quiesced) quiescer_.Release();
  return failed;
}

absl::StatusOr<size_t> SleepCoordinator::Wake() {
  MutexLock lock(&mu_);
  // Before the memory: a kernel meets the low limit only where it would meet
  // paused memory.
  absl::Status stack = stack_ == nullptr ? absl::OkStatus() : stack_->Restore();
  if (!stack.ok()) {
    Log().warn("the contexts' stack limit is not set back yet (the next wake tries again): {}",
               std::string(stack.message()));
  }
  absl::StatusOr<size_t> restored = ResumeRecorded(TagSelection::All(), false);
  if (!restored.ok()) return restored;  // everything stays paused, the threads held
  holding_ = false;
  quiescer_.Release();
  return restored;
}

bool SleepCoordinator::holding() const {
  MutexLock lock(&mu_);
  return holding_;
}

}  // namespace vmmshim

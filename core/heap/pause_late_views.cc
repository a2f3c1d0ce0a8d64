// Note [Views made late] (core/heap/pause.h): the coordinator's thread that
// maps the views of kept contents once the host memory made for them in the
// background is there.
#include <chrono>
#include <system_error>
#include <thread>

#include "core/base/log.h"
#include "core/heap/pause.h"

namespace vmmshim {

void PauseCoordinator::ScheduleLateViewsLocked() {
  if (!host_memory_in_background_ || late_stopping_) return;
  late_pending_ = true;
  if (!late_thread_.joinable()) {
    try {
      late_thread_ = std::thread([this] { MapLateViewsWhenMade(); });
    } catch (const std::system_error&) {
      // No thread to be had (a pids limit): those contents stay as fault
      // keeps them until their resume, as before this thread.
      late_pending_ = false;
      return;
    }
  }
  late_wanted_.SignalAll();
}

void PauseCoordinator::StopLateViews() {
  {
    MutexLock lock(&mu_);
    late_stopping_ = true;
    late_wanted_.SignalAll();
  }
  if (late_thread_.joinable()) late_thread_.join();
}

void PauseCoordinator::MapLateViewsWhenMade() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      while (!late_stopping_ && !late_pending_) late_wanted_.Wait(&mu_);
      if (late_stopping_) return;
      late_pending_ = false;
    }
    // Outside the mutex: pauses and resumes go on while the pools make it.
    // Looked at every 100 ms: a stop (teardown, exit) is not kept waiting.
    for (HostMappedPool* pool : host_pools_.All()) {
      while (!pool->AwaitMade(absl::Milliseconds(100))) {
        MutexLock lock(&mu_);
        if (late_stopping_) return;
      }
    }
    // A pause or resume waiting for the mutex goes first.
    while (waiting_.load(std::memory_order_relaxed) > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    MutexLock lock(&mu_);
    if (late_stopping_) return;
    const auto start = std::chrono::steady_clock::now();
    size_t bytes = 0;
    for (PausableMemory* memory : Memories()) {
      memory->Lock();
      bytes += memory->MapLateViews(host_pools_, waiting_);
      memory->Unlock();
      if (waiting_.load(std::memory_order_relaxed) > 0) {
        late_pending_ = true;  // back after the pause or resume, for the rest
        break;
      }
    }
    if (bytes > 0) {
      Log().info("{} bytes of paused contents moved into the host memory made for them in the "
                 "background and mapped at their addresses ({:.3f} s): an access to them no "
                 "longer faults",
                 bytes,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
}

}  // namespace vmmshim

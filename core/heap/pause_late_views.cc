// Note [Views made late] (core/heap/pause.h): the coordinator's thread that
// maps the views of kept contents once the host memory made for them in the
// background is there.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "core/base/log.h"
#include "core/heap/pause.h"
#include "core/sync/capture.h"

namespace vmmshim {

LateMove MoveIntoMadeHostMemory(HostMappedPool& pool, std::optional<HostBackup>* backup,
                                size_t bytes, const std::atomic<int>& waiting) {
  absl::StatusOr<HostMappedMemory> memory = pool.TakeKept(bytes);
  if (!memory.ok()) return LateMove::kNoneMade;
  for (size_t off = 0; off < bytes; off += PausableMemory::kLateCopyBytes) {
    if (waiting.load(std::memory_order_relaxed) > 0) {
      pool.Give(*std::move(memory));  // back later
      return LateMove::kStopped;
    }
    std::memcpy(memory->data() + off, (*backup)->data() + off,
                std::min(PausableMemory::kLateCopyBytes, bytes - off));
  }
  *backup = HostBackup::FromHostMapped(*std::move(memory), pool);
  return LateMove::kMoved;
}

void PauseCoordinator::ScheduleLateViewsLocked() {
  if (!host_memory_in_background_ || late_stopping_.load()) return;
  late_pending_ = true;
  if (!late_thread_.joinable()) {
    try {
      late_running_.store(true);
      late_thread_ = std::thread([this] {
        RelaxCaptureModeOfThisThread(driver_);  // Note [The shim's own threads and captures]
        MapLateViewsWhenMade();
        late_running_.store(false);
      });
    } catch (const std::system_error&) {
      late_running_.store(false);
      // No thread to be had (a pids limit): those contents stay as fault
      // keeps them until their resume, as before this thread.
      late_pending_ = false;
      return;
    }
  }
  late_wanted_.SignalAll();
}

void PauseCoordinator::StopLateViews(bool at_exit) {
  if (late_stopping_.exchange(true)) return;
  waiting_.fetch_add(1);  // for good: a pass under way stops at its next check
  late_wanted_.SignalAll();  // without the mutex; the thread looks every 100 ms too
  if (!late_thread_.joinable()) return;
  if (at_exit) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (late_running_.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (late_running_.load()) {
      Log().warn("at exit: the thread that maps paused contents late is still waiting (a pause "
                 "or resume holds the pause mutex); left to the process's end");
      late_thread_.detach();
      return;
    }
  }
  late_thread_.join();
}

void PauseCoordinator::MapLateViewsWhenMade() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      while (!late_stopping_.load() && !late_pending_) {
        late_wanted_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
      }
      if (late_stopping_.load()) return;
      late_pending_ = false;
    }
    // Outside the mutex: pauses and resumes go on while the pools make it.
    // Looked at every 100 ms: a stop (teardown, exit) is not kept waiting.
    for (HostMappedPool* pool : host_pools_.All()) {
      while (!pool->AwaitMade(absl::Milliseconds(100))) {
        if (late_stopping_.load()) return;
      }
    }
    // A pause or resume waiting for the mutex goes first.
    while (waiting_.load(std::memory_order_relaxed) > 0) {
      if (late_stopping_.load()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    MutexLock lock(&mu_);
    if (late_stopping_.load()) return;
    const auto start = std::chrono::steady_clock::now();
    size_t bytes = 0;
    for (PausableMemory* memory : Memories()) {
      bytes += memory->MapLateViews(host_pools_, waiting_);  // takes its own locks
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

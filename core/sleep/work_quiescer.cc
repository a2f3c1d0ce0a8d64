#include "core/sleep/work_quiescer.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/log.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/driver/work_submission.h"

namespace vmmshim {
namespace {

std::string Seconds(std::chrono::milliseconds d) {
  return absl::StrCat(static_cast<double>(d.count()) / 1000.0, " s");
}

// What the synchronizing thread reports (shared: the thread may outlive the
// caller's wait).
struct SyncState {
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  int device = -1;  // being synchronized now
  absl::Status status;
};

}  // namespace

WorkQuiescer::WorkQuiescer(const DriverApi& driver, SubmissionGate& gate,
                           CaptureTracker& captures, std::chrono::milliseconds timeout)
    : driver_(driver), gate_(gate), captures_(captures), timeout_(timeout) {}

absl::Status WorkQuiescer::Quiesce() {
  // No capture begins between this check and the end of the synchronize,
  // which would invalidate it (core/sync/capture.h; the pause holds the
  // same gate across its own synchronize).
  GateReaderLock capture_gate(&captures_.gate());
  if (captures_.any()) {
    return Reworded(DriverError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "quiesce"),
                    "a stream capture is in progress: the program's work cannot be quiesced "
                    "(its synchronize would invalidate the capture)");
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout_;
  // Host functions that pass the gate from now on need another synchronize.
  const uint64_t passes = gate_.exempt_passes();
  gate_.Close();
  std::vector<SubmissionGate::Inside> inside = gate_.WaitForCallsInside(deadline);
  if (!inside.empty()) {
    gate_.Open();
    std::vector<std::string> named;
    for (const SubmissionGate::Inside& call : inside) {
      named.push_back(absl::StrCat("thread ", call.tid, " in ", WorkSubmissionName(call.entry)));
    }
    return Reworded(DriverError(CUDA_ERROR_TIMEOUT, "quiesce"),
                    absl::StrCat("the program's GPU work could not be quiesced: after ",
                                 Seconds(timeout_), " (VMMSHIM_QUIESCE_TIMEOUT) still inside "
                                 "the driver: ", absl::StrJoin(named, ", "),
                                 "; the program's work goes on"));
  }
  const auto drained = std::chrono::steady_clock::now();
  if (absl::Status synced = SynchronizeContexts(deadline, passes); !synced.ok()) {
    gate_.Open();
    return synced;
  }
  const auto end = std::chrono::steady_clock::now();
  Log().info("quiesced the program's GPU work in {:.3f} s (calls inside the driver {:.3f} s, "
             "synchronize {:.3f} s; {} thread(s) held)",
             std::chrono::duration<double>(end - start).count(),
             std::chrono::duration<double>(drained - start).count(),
             std::chrono::duration<double>(end - drained).count(), gate_.waiting());
  return absl::OkStatus();
}

absl::Status WorkQuiescer::SynchronizeContexts(std::chrono::steady_clock::time_point deadline,
                                               uint64_t passes) {
  int count = 0;
  if (CUresult r = driver_.cuDeviceGetCount(&count); r != CUDA_SUCCESS) {
    return DriverError(r, "cuDeviceGetCount");
  }
  // Host functions that submit work while the contexts are synchronized
  // pass the gate; their work needs one more synchronize. Bounded: a
  // program's host functions that keep submitting end at the deadline.
  while (true) {
    auto state = std::make_shared<SyncState>();
    // The table is copied: the thread may outlive a caller that gave up.
    std::thread synchronizer;
    try {
      synchronizer = std::thread([state, count, driver = driver_] {
      absl::Status status;
      for (int device = 0; device < count && status.ok(); ++device) {
        {
          std::lock_guard<std::mutex> lock(state->mu);
          state->device = device;
        }
        CUcontext context = ActivePrimaryContext(driver, device);
        if (context != nullptr) status = SynchronizeContext(driver, context);
      }
      std::lock_guard<std::mutex> lock(state->mu);
      state->status = status;
      state->done = true;
      state->done_cv.notify_all();
      });
    } catch (const std::system_error& e) {
      return DriverError(CUDA_ERROR_OPERATING_SYSTEM,
                         absl::StrCat("quiesce: no thread for the synchronize (", e.what(), ")"));
    }
    synchronizer.detach();
    std::unique_lock<std::mutex> lock(state->mu);
    if (!state->done_cv.wait_until(lock, deadline, [&] { return state->done; })) {
      const std::string what =
          state->device < 0 ? std::string("the contexts' synchronize did not start")
                            : absl::StrCat("device ", state->device,
                                           "'s context did not finish its work");
      return Reworded(DriverError(CUDA_ERROR_TIMEOUT, "quiesce"),
                      absl::StrCat("the program's GPU work could not be quiesced: ", what,
                                   " within ", Seconds(timeout_),
                                   " (VMMSHIM_QUIESCE_TIMEOUT; a kernel waiting for the host, "
                                   "or a host function or graph host node that calls CUDA?); "
                                   "the program's work goes on"));
    }
    if (!state->status.ok()) return state->status;
    const uint64_t now_passes = gate_.exempt_passes();
    if (now_passes == passes) return absl::OkStatus();
    passes = now_passes;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Reworded(DriverError(CUDA_ERROR_TIMEOUT, "quiesce"),
                      "the program's host functions kept submitting GPU work; nothing paused");
    }
  }
}

}  // namespace vmmshim

#include "core/sync/capture.h"

#include <algorithm>
#include <new>

namespace vmmshim {
namespace {

// The per-thread default stream and the legacy stream name a different
// stream in each thread.
bool IsThreadRelative(CUstream stream, bool per_thread) {
  return stream == CU_STREAM_PER_THREAD || (per_thread && stream == nullptr);
}

}  // namespace

void RelaxCaptureModeOfThisThread(const DriverApi& driver) {
  if (driver.cuThreadExchangeStreamCaptureMode == nullptr) return;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  driver.cuThreadExchangeStreamCaptureMode(&mode);
}

ScopedRelaxedCaptureMode::ScopedRelaxedCaptureMode(const DriverApi& driver) : driver_(driver) {
  if (driver_.cuThreadExchangeStreamCaptureMode == nullptr) return;
  exchanged_ = driver_.cuThreadExchangeStreamCaptureMode(&previous_) == CUDA_SUCCESS;
}

ScopedRelaxedCaptureMode::~ScopedRelaxedCaptureMode() {
  if (exchanged_) driver_.cuThreadExchangeStreamCaptureMode(&previous_);
}

void CaptureTracker::Began(CUstream stream, bool per_thread) {
  MutexLock lock(&mu_);
  captures_.push_back(Capture{stream, per_thread, std::this_thread::get_id()});
  active_.store(static_cast<int>(captures_.size()), std::memory_order_release);
}

bool CaptureTracker::StillCapturing(const Capture& c) const {
  if (IsThreadRelative(c.stream, c.per_thread) && c.thread != std::this_thread::get_id()) {
    return true;  // only its own thread can ask
  }
  // An error (a destroyed stream) means no capture there any more.
  return IsCapturing(c.stream, c.per_thread).value_or(false);
}

std::optional<bool> CaptureTracker::IsCapturing(CUstream stream, bool per_thread) const {
  auto query = per_thread ? driver_.cuStreamIsCapturing_ptsz : driver_.cuStreamIsCapturing;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (query == nullptr || query(stream, &status) != CUDA_SUCCESS) return std::nullopt;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void CaptureTracker::Ended(CUstream stream, bool per_thread) {
  MutexLock lock(&mu_);
  // An ordinary stream is the same stream through either entry point; the
  // per-thread default stream is this thread's only.
  auto it = std::find_if(captures_.begin(), captures_.end(), [&](const Capture& c) {
    if (c.stream != stream) return false;
    const bool relative = IsThreadRelative(c.stream, c.per_thread);
    if (relative != IsThreadRelative(stream, per_thread)) return false;
    return !relative || c.thread == std::this_thread::get_id();
  });
  if (it == captures_.end() || StillCapturing(*it)) return;
  captures_.erase(it);
  active_.store(static_cast<int>(captures_.size()), std::memory_order_release);
}

void CaptureTracker::Refresh() {
  MutexLock lock(&mu_);
  captures_.erase(std::remove_if(captures_.begin(), captures_.end(),
                                 [&](const Capture& c) { return !StillCapturing(c); }),
                  captures_.end());
  active_.store(static_cast<int>(captures_.size()), std::memory_order_release);
}

CUresult CaptureTracker::ProbeUnsafeCall() const { return driver_.cuMemFree_v2(0); }

void CaptureTracker::AfterForkChild() {
  new (&mu_) Mutex;
  gate_.AfterForkChild();
  captures_.clear();  // captures belong to the parent's threads
  active_.store(0, std::memory_order_release);
}

}  // namespace vmmshim

#include "core/lifecycle/stack_reservation.h"

#include <algorithm>

#include "core/driver/context.h"
#include "core/driver/cu_status.h"

namespace vmmshim {

CUresult StackReservation::SetStackLimit(CUcontext context, size_t bytes) const {
  ContextScope scope(driver_, context);
  return driver_.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, bytes);
}

absl::Status StackReservation::Release(int* lowered) {
  if (lowered != nullptr) *lowered = 0;
  if (driver_.cuCtxGetLimit == nullptr || driver_.cuCtxSetLimit == nullptr) {
    return absl::OkStatus();
  }
  int count = 0;
  if (driver_.cuDeviceGetCount(&count) != CUDA_SUCCESS) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  std::vector<Lowered> now;
  CUresult failed = CUDA_SUCCESS;
  const char* what = "";
  for (int device = 0; device < count && failed == CUDA_SUCCESS; ++device) {
    CUcontext context = ActivePrimaryContext(driver_, device);
    if (context == nullptr) continue;
    const bool already = std::any_of(lowered_.begin(), lowered_.end(), [&](const Lowered& l) {
      return l.context == context;
    });
    if (already) continue;
    size_t bytes = 0;
    {
      ContextScope scope(driver_, context);
      failed = driver_.cuCtxGetLimit(&bytes, CU_LIMIT_STACK_SIZE);
      what = "cuCtxGetLimit(CU_LIMIT_STACK_SIZE)";
    }
    if (failed != CUDA_SUCCESS || bytes == 0) continue;
    failed = SetStackLimit(context, 0);
    what = "cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0)";
    if (failed == CUDA_SUCCESS) now.push_back({context, bytes});
  }
  if (failed != CUDA_SUCCESS) {
    for (const Lowered& l : now) SetStackLimit(l.context, l.stack_bytes);
    return DriverError(failed, what);
  }
  if (lowered != nullptr) *lowered = static_cast<int>(now.size());
  lowered_.insert(lowered_.end(), now.begin(), now.end());
  return absl::OkStatus();
}

absl::Status StackReservation::Restore(int* restored) {
  if (restored != nullptr) *restored = 0;
  absl::MutexLock lock(&mu_);
  absl::Status first;
  std::vector<Lowered> kept;
  for (const Lowered& l : lowered_) {
    if (CUresult r = SetStackLimit(l.context, l.stack_bytes); r != CUDA_SUCCESS) {
      if (first.ok()) first = DriverError(r, "cuCtxSetLimit(CU_LIMIT_STACK_SIZE)");
      kept.push_back(l);
    } else if (restored != nullptr) {
      ++*restored;
    }
  }
  lowered_ = std::move(kept);
  return first;
}

int StackReservation::lowered() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(lowered_.size());
}

}  // namespace vmmshim

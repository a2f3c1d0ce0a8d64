#include "core/driver/context.h"

#include <atomic>

#include "core/base/tls.h"
#include "core/driver/cu_status.h"

namespace vmmshim {
namespace {

std::atomic<uint64_t> g_context_epoch{1};
struct ContextMemo {
  CUcontext context = nullptr;
  int device = -1;
  uint64_t epoch = 0;
};
VMMSHIM_INITIAL_EXEC_TLS thread_local ContextMemo t_context_memo;

}  // namespace

void ForgetContexts() { g_context_epoch.fetch_add(1, std::memory_order_acq_rel); }

uint64_t ContextEpoch() { return g_context_epoch.load(std::memory_order_acquire); }

bool CurrentContext(const DriverApi& driver, CUcontext* context, int* device) {
  if (driver.cuCtxGetCurrent(context) != CUDA_SUCCESS || *context == nullptr) return false;
  ContextMemo& memo = t_context_memo;
  const uint64_t epoch = ContextEpoch();
  if (memo.context == *context && memo.epoch == epoch) {
    *device = memo.device;
    return true;
  }
  CUdevice d = 0;
  if (driver.cuCtxGetDevice(&d) != CUDA_SUCCESS) return false;
  memo = ContextMemo{*context, d, epoch};
  *device = d;
  return true;
}

absl::Status SynchronizeContext(const DriverApi& driver, CUcontext context) {
  if (driver.cuCtxSynchronize_v2 != nullptr) {
    return DriverError(driver.cuCtxSynchronize_v2(context), "cuCtxSynchronize");
  }
  CUcontext current = nullptr;
  CUresult r = driver.cuCtxGetCurrent(&current);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuCtxGetCurrent");
  if (current == context) return DriverError(driver.cuCtxSynchronize(), "cuCtxSynchronize");
  r = driver.cuCtxPushCurrent_v2(context);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuCtxPushCurrent");
  r = driver.cuCtxSynchronize();
  CUcontext popped = nullptr;
  driver.cuCtxPopCurrent_v2(&popped);
  return DriverError(r, "cuCtxSynchronize");
}

CUcontext ActivePrimaryContext(const DriverApi& driver, CUdevice device) {
  const DriverApi& d = driver;
  if (d.cuDevicePrimaryCtxGetState == nullptr || d.cuDevicePrimaryCtxRetain == nullptr ||
      d.cuDevicePrimaryCtxRelease_v2 == nullptr) {
    return nullptr;
  }
  unsigned int flags = 0;
  int active = 0;
  if (d.cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || active == 0) {
    return nullptr;
  }
  CUcontext ctx = nullptr;
  if (d.cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS) return nullptr;
  d.cuDevicePrimaryCtxRelease_v2(device);  // back to its count, at least 1: stays alive
  return ctx;
}

}  // namespace vmmshim

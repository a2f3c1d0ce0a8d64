#include "core/lifecycle/context_lifecycle.h"

#include "core/base/log.h"
#include "core/driver/context.h"

namespace vmmshim {

void ContextLifecycle::ReleaseContextMemory(CUcontext ctx, bool synchronize,
                                            const char* why) const {
  const size_t released = allocator_.ReleaseContext(ctx, synchronize);
  if (ipc_ != nullptr) ipc_->ReleaseContext(ctx);
  if (released > 0) Log().info("{}: released {} bytes of device memory", why, released);
}

CUresult ContextLifecycle::PrimaryCtxReset(PFN_cuDevicePrimaryCtxReset_v11000 real,
                                           CUdevice device) const {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUcontext ctx = ActivePrimaryContext(driver_, device);
  Log().debug("cuDevicePrimaryCtxReset({}): primary context {}", device, static_cast<void*>(ctx));
  if (ctx != nullptr) ReleaseContextMemory(ctx, true, "cuDevicePrimaryCtxReset");
  CUresult r = real(device);
  ForgetContexts();
  return r;
}

CUresult ContextLifecycle::PrimaryCtxRelease(PFN_cuDevicePrimaryCtxRelease_v11000 real,
                                             CUdevice device) const {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUcontext ctx = ActivePrimaryContext(driver_, device);
  CUresult r = real(device);
  Log().debug("cuDevicePrimaryCtxRelease({}): primary context {} -> {}", device,
              static_cast<void*>(ctx), static_cast<int>(r));
  if (r != CUDA_SUCCESS || ctx == nullptr) return r;
  unsigned int flags = 0;
  int active = 1;
  if (driver_.cuDevicePrimaryCtxGetState(device, &flags, &active) == CUDA_SUCCESS &&
      active == 0) {
    ReleaseContextMemory(ctx, false, "cuDevicePrimaryCtxRelease (last reference)");
  }
  return r;
}

CUresult ContextLifecycle::CtxDestroy(PFN_cuCtxDestroy_v4000 real, CUcontext ctx) const {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(ctx);
  // The driver waited for the context's work before destroying it.
  if (r == CUDA_SUCCESS) ReleaseContextMemory(ctx, false, "cuCtxDestroy");
  return r;
}

}  // namespace vmmshim

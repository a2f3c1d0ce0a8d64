// Context lifecycle hooks: cudaDeviceReset, the primary context's release,
// cuCtxDestroy. What the shim does around the real call is
// core/lifecycle/context_lifecycle.h's. The _v2 and the original exports share one
// ABI and are both resolved by cudart; each hook passes the driver's function
// of its own version.
#include "core/lifecycle/context_lifecycle.h"
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Runtime;

namespace {

vmmshim::ContextLifecycle LifecycleOf(const Runtime& rt) {
  return vmmshim::ContextLifecycle(rt.driver, *rt.allocator, rt.ipc);
}

CUresult PrimaryCtxReset(const Runtime& rt, PFN_cuDevicePrimaryCtxReset_v11000 real,
                         CUdevice device) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt.enabled()) return real(device);
  return LifecycleOf(rt).PrimaryCtxReset(real, device);
}

CUresult PrimaryCtxRelease(const Runtime& rt, PFN_cuDevicePrimaryCtxRelease_v11000 real,
                           CUdevice device) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt.enabled()) return real(device);
  return LifecycleOf(rt).PrimaryCtxRelease(real, device);
}

CUresult CtxDestroy(const Runtime& rt, PFN_cuCtxDestroy_v4000 real, CUcontext ctx) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt.enabled()) return real(ctx);
  return LifecycleOf(rt).CtxDestroy(real, ctx);
}

}  // namespace

VMMSHIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return PrimaryCtxReset(*rt, rt->driver.cuDevicePrimaryCtxReset_v2, device);
}

VMMSHIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice device) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return PrimaryCtxReset(*rt, rt->driver.cuDevicePrimaryCtxReset, device);
}

VMMSHIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return PrimaryCtxRelease(*rt, rt->driver.cuDevicePrimaryCtxRelease_v2, device);
}

VMMSHIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return PrimaryCtxRelease(*rt, rt->driver.cuDevicePrimaryCtxRelease, device);
}

VMMSHIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CtxDestroy(*rt, rt->driver.cuCtxDestroy_v2, ctx);
}

VMMSHIM_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return CtxDestroy(*rt, rt->driver.cuCtxDestroy, ctx);
}

// IPC hooks (core/ipc/ipc.h): shim memory gets and opens vmmshim handles; any
// other pointer or handle goes to the driver.
#include "core/driver/cu_status.h"
#include "core/ipc/ipc_handle.h"
#include "core/base/log.h"
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Log;
using vmmshim::Runtime;
using vmmshim::ToCuResult;

// cudaIpcGetMemHandle arrives here. Shim memory gets a vmmshim handle;
// anything else goes to the driver.
VMMSHIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || rt->driver.cuIpcGetMemHandle == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled() || rt->ipc == nullptr || handle == nullptr) {
    return rt->driver.cuIpcGetMemHandle(handle, dptr);
  }
  absl::Status exported = rt->ipc->Export(dptr, reinterpret_cast<uint8_t*>(handle->reserved));
  if (vmmshim::IsNotShimMemory(exported)) return rt->driver.cuIpcGetMemHandle(handle, dptr);
  return ToCuResult(exported);
}

namespace {

// cuIpcOpenMemHandle (cudaVersion 4010) and _v2 (11000) have one ABI; cudart
// resolves both. `real` is the driver's function of the caller's version.
CUresult IpcOpen(const Runtime& rt, PFN_cuIpcOpenMemHandle_v11000 real, CUdeviceptr* pdptr,
                 CUipcMemHandle handle, unsigned int flags) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  vmmshim::IpcHandleFields fields;
  const vmmshim::IpcHandleKind kind =
      vmmshim::DecodeIpcHandle(reinterpret_cast<const uint8_t*>(handle.reserved), &fields);
  if (!rt.enabled() || rt.ipc == nullptr || pdptr == nullptr ||
      kind == vmmshim::IpcHandleKind::kForeign) {
    return real(pdptr, handle, flags);
  }
  if (kind == vmmshim::IpcHandleKind::kMalformed) {
    Log().warn("cuIpcOpenMemHandle: a vmmshim handle that is truncated or corrupted "
               "(version, reserved bytes or fields invalid)");
    return CUDA_ERROR_INVALID_VALUE;
  }
  absl::StatusOr<CUdeviceptr> opened = rt.ipc->Open(fields, flags);
  if (!opened.ok()) return ToCuResult(opened.status());
  *pdptr = *opened;
  return CUDA_SUCCESS;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                              unsigned int flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return IpcOpen(*rt, rt->driver.cuIpcOpenMemHandle_v2, pdptr, handle, flags);
}

VMMSHIM_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                           unsigned int flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return IpcOpen(*rt, rt->driver.cuIpcOpenMemHandle, pdptr, handle, flags);
}

VMMSHIM_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || rt->driver.cuIpcCloseMemHandle == nullptr) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  if (!rt->enabled() || rt->ipc == nullptr) return rt->driver.cuIpcCloseMemHandle(dptr);
  absl::StatusOr<bool> closed = rt->ipc->Close(dptr);
  if (!closed.ok()) return ToCuResult(closed.status());
  return *closed ? CUDA_SUCCESS : rt->driver.cuIpcCloseMemHandle(dptr);
}

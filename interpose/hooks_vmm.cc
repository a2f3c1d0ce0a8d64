// Other libraries' own VMM calls (cuMemCreate, cuMemMap, ...: PyTorch's
// expandable segments, vLLM's CuMemAllocator, NCCL), observed: each call
// goes to the driver unchanged, with the same arguments and result, and a
// call that succeeded is recorded in core/foreign/foreign_vmm.h for the
// residency report. The shim's own VMM calls reach the driver through its
// table, never through these hooks.
#include "core/foreign/foreign_vmm.h"
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Runtime;

namespace {

// The registry when the shim serves this process, else nullptr (then the
// call is only passed on).
vmmshim::ForeignVmm* Registry(const Runtime& rt) {
  return rt.enabled() ? &rt.allocator->foreign() : nullptr;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                    const CUmemAllocationProp* prop, unsigned long long flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = rt->driver.cuMemCreate(handle, size, prop, flags);
  if (r == CUDA_SUCCESS) {
    if (vmmshim::ForeignVmm* f = Registry(*rt)) {
      f->Created(*handle, size, *prop, vmmshim::AllocationTag());
    }
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = rt->driver.cuMemRelease(handle);
  if (r == CUDA_SUCCESS) {
    if (vmmshim::ForeignVmm* f = Registry(*rt)) f->Released(handle);
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                    void* addr) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuMemRetainAllocationHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = rt->driver.cuMemRetainAllocationHandle(handle, addr);
  if (r == CUDA_SUCCESS) {
    if (vmmshim::ForeignVmm* f = Registry(*rt)) f->Retained(*handle);
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = rt->driver.cuMemMap(ptr, size, offset, handle, flags);
  if (r == CUDA_SUCCESS) {
    if (vmmshim::ForeignVmm* f = Registry(*rt)) f->Mapped(ptr, size, handle);
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = rt->driver.cuMemUnmap(ptr, size);
  if (r == CUDA_SUCCESS) {
    if (vmmshim::ForeignVmm* f = Registry(*rt)) f->Unmapped(ptr, size);
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuMemExportToShareableHandle(void* shareable,
                                                     CUmemGenericAllocationHandle handle,
                                                     CUmemAllocationHandleType type,
                                                     unsigned long long flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuMemExportToShareableHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = rt->driver.cuMemExportToShareableHandle(shareable, handle, type, flags);
  if (r == CUDA_SUCCESS) {
    if (vmmshim::ForeignVmm* f = Registry(*rt)) f->Exported(handle);
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                       void* os_handle,
                                                       CUmemAllocationHandleType type) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuMemImportFromShareableHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const CUresult r = rt->driver.cuMemImportFromShareableHandle(handle, os_handle, type);
  if (r == CUDA_SUCCESS) {
    if (vmmshim::ForeignVmm* f = Registry(*rt)) {
      // Its device, for the report; a driver that cannot say leaves it uncounted.
      CUmemAllocationProp prop = {};
      const bool known = rt->driver.cuMemGetAllocationPropertiesFromHandle != nullptr &&
                         rt->driver.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) ==
                             CUDA_SUCCESS;
      f->Imported(*handle, known ? &prop : nullptr);
    }
  }
  return r;
}

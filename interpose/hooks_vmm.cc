// Other libraries' own VMM calls (cuMemCreate, cuMemMap, cuMemSetAccess,
// cuMemAddressReserve, ...: PyTorch's expandable segments, vLLM's CuMemAllocator, NCCL), handed
// to core/foreign/foreign_vmm.h, which makes each in the driver with the
// caller's arguments, records what succeeded (for the residency report and
// pause), and answers for memory it paused. When the shim does not serve
// the process the call goes to the driver unchanged. The shim's own VMM
// calls reach the driver through its table, never through these hooks.
#include "core/foreign/foreign_vmm.h"
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Runtime;

namespace {

// The registry when the shim serves this process, else nullptr (then the
// call is only passed on).
vmmshim::ForeignVmm* Registry(const Runtime& rt) {
  return rt.enabled() ? &rt.core->foreign() : nullptr;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                    const CUmemAllocationProp* prop, unsigned long long flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) {
    return f->Create(handle, size, prop, flags, vmmshim::AllocationTag());
  }
  return rt->driver.cuMemCreate(handle, size, prop, flags);
}

VMMSHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->Release(handle);
  return rt->driver.cuMemRelease(handle);
}

VMMSHIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                    void* addr) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->Retain(handle, addr);
  if (rt->driver.cuMemRetainAllocationHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return rt->driver.cuMemRetainAllocationHandle(handle, addr);
}

VMMSHIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->Map(ptr, size, offset, handle, flags);
  return rt->driver.cuMemMap(ptr, size, offset, handle, flags);
}

VMMSHIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->Unmap(ptr, size);
  return rt->driver.cuMemUnmap(ptr, size);
}

VMMSHIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                       size_t count) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->SetAccess(ptr, size, desc, count);
  return rt->driver.cuMemSetAccess(ptr, size, desc, count);
}

VMMSHIM_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->GetProperties(prop, handle);
  if (rt->driver.cuMemGetAllocationPropertiesFromHandle == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return rt->driver.cuMemGetAllocationPropertiesFromHandle(prop, handle);
}

VMMSHIM_EXPORT CUresult cuMemExportToShareableHandle(void* shareable,
                                                     CUmemGenericAllocationHandle handle,
                                                     CUmemAllocationHandleType type,
                                                     unsigned long long flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->Export(shareable, handle, type, flags);
  if (rt->driver.cuMemExportToShareableHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return rt->driver.cuMemExportToShareableHandle(shareable, handle, type, flags);
}

VMMSHIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                       void* os_handle,
                                                       CUmemAllocationHandleType type) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->Import(handle, os_handle, type);
  if (rt->driver.cuMemImportFromShareableHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return rt->driver.cuMemImportFromShareableHandle(handle, os_handle, type);
}

VMMSHIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                            CUdeviceptr addr, unsigned long long flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->Reserve(ptr, size, alignment, addr, flags);
  return rt->driver.cuMemAddressReserve(ptr, size, alignment, addr, flags);
}

VMMSHIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (vmmshim::ForeignVmm* f = Registry(*rt)) return f->Free(ptr, size);
  return rt->driver.cuMemAddressFree(ptr, size);
}

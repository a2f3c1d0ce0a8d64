// Memory hooks: allocation, free, queries about shim memory, stream-ordered
// free. Arguments the driver would reject (NULL out-pointers, size 0, bad
// element sizes) go to the real driver, so the application gets exactly the
// driver's code for them.
#include <atomic>
#include <optional>

#include "core/driver/cu_status.h"
#include "core/base/log.h"
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Log;
using vmmshim::Runtime;
using vmmshim::ToCuResult;
using vmmshim::Trace;

namespace {

// One-line notices at the first occurrence, not per call.
void NoticeOnce(std::atomic<bool>& flag, const char* message) {
  if (!flag.exchange(true, std::memory_order_relaxed)) Log().info("{}", message);
}
std::atomic<bool> g_alloc_notice{false};
std::atomic<bool> g_free_notice{false};

// The device of the current context, or -1 (the residency report's
// passed-through figure is per device).
int CurrentDevice(const Runtime& rt) {
  CUdevice device = -1;
  return rt.driver.cuCtxGetDevice(&device) == CUDA_SUCCESS ? device : -1;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled() || dptr == nullptr || bytesize == 0) {
    return rt->driver.cuMemAlloc_v2(dptr, bytesize);
  }
  const uint16_t library = VMMSHIM_CALLER_LIBRARY(*rt);
  absl::StatusOr<vmmshim::Allocator::Allocation> a =
      rt->allocator->Allocate(bytesize, vmmshim::AllocationTag(), library);
  if (!a.ok()) {
    Log().debug("cuMemAlloc({}) -> {}", bytesize, a.status().ToString());
    *dptr = 0;  // as the driver does on failure (seen on H200: OOM leaves 0)
    vmmshim::NoteAllocationFailed(*rt, a.status(), "cuMemAlloc", bytesize, library);
    return ToCuResult(a.status());
  }
  if (!a->served) {
    NoticeOnce(g_alloc_notice,
               "an allocation went to the driver (no current context, or a device without "
               "VMM support); further ones are counted in the exit report");
    CUresult r = rt->driver.cuMemAlloc_v2(dptr, bytesize);
    if (r == CUDA_SUCCESS) {
      rt->core->counters().PassThroughLive(*dptr, bytesize, CurrentDevice(*rt));
      Trace(*rt, "alloc", bytesize, *dptr);
    }
    return r;
  }
  *dptr = a->ptr;
  vmmshim::ArmExitRelease();
  Trace(*rt, "alloc", bytesize, a->ptr);
  vmmshim::NoteAllocation(*rt, a->device, a->ptr, bytesize, library);
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width,
                                           size_t height, unsigned int element_size) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const bool valid = dptr != nullptr && pitch != nullptr && width != 0 && height != 0 &&
                     (element_size == 4 || element_size == 8 || element_size == 16);
  if (!rt->enabled() || !valid) {
    return rt->driver.cuMemAllocPitch_v2(dptr, pitch, width, height, element_size);
  }
  const uint16_t library = VMMSHIM_CALLER_LIBRARY(*rt);
  absl::StatusOr<vmmshim::Allocator::Allocation> a =
      rt->allocator->AllocatePitch(width, height, pitch, vmmshim::AllocationTag(), library);
  if (!a.ok()) {
    *dptr = 0;
    // width x height: *pitch is not set when the request overflows.
    vmmshim::NoteAllocationFailed(*rt, a.status(), "cuMemAllocPitch", width * height, library);
    return ToCuResult(a.status());
  }
  if (!a->served) {
    CUresult r = rt->driver.cuMemAllocPitch_v2(dptr, pitch, width, height, element_size);
    if (r == CUDA_SUCCESS) {
      rt->core->counters().PassThroughLive(*dptr, *pitch * height, CurrentDevice(*rt));
    }
    return r;
  }
  *dptr = a->ptr;
  vmmshim::ArmExitRelease();
  vmmshim::NoteAllocation(*rt, a->device, a->ptr, *pitch * height, library);
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled() || dptr == 0) return rt->driver.cuMemFree_v2(dptr);
  const std::optional<vmmshim::PointerInfo> before = vmmshim::BeforeFree(*rt, dptr);
  absl::Status freed = rt->allocator->Free(dptr);
  if (vmmshim::IsNotShimMemory(freed)) {
    NoticeOnce(g_free_notice,
               "a pointer not allocated by vmmshim was freed through the driver (allocated "
               "before the shim took over, or passed through); further ones are not logged");
    CUresult r = rt->driver.cuMemFree_v2(dptr);
    if (r == CUDA_SUCCESS) {
      rt->core->counters().PassThroughFreed(dptr);
      Trace(*rt, "free", 0, dptr);
    }
    return r;
  }
  if (!freed.ok()) return ToCuResult(freed);
  Trace(*rt, "free", 0, dptr);
  if (before.has_value()) vmmshim::NoteFree(*rt, before, VMMSHIM_CALLER_LIBRARY(*rt));
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = rt->driver.cuMemGetInfo_v2(free, total);
  if (r != CUDA_SUCCESS || !rt->enabled() || free == nullptr) return r;
  // Memory the shim keeps mapped without serving an allocation is free to
  // the application.
  // Stream-ordered blocks beyond the pool's release threshold are released
  // first, as the driver would have at the last synchronize.
  CUdevice device = 0;
  if (rt->driver.cuCtxGetDevice(&device) == CUDA_SUCCESS) {
    rt->core->stream_ordered().SettleStreamOrdered(device);
    *free += rt->core->control().IdleBytes(device);
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                                CUdeviceptr dptr) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled()) return rt->driver.cuMemGetAddressRange_v2(pbase, psize, dptr);
  absl::StatusOr<vmmshim::PointerInfo> info = rt->allocator->Find(dptr);
  if (vmmshim::IsNotShimMemory(info.status())) {
    return rt->driver.cuMemGetAddressRange_v2(pbase, psize, dptr);
  }
  if (!info.ok()) return ToCuResult(info.status());
  if (pbase != nullptr) *pbase = info->range_base;
  if (psize != nullptr) *psize = info->range_size;
  return CUDA_SUCCESS;
}

namespace {

// Overrides the attributes whose answer the shim defines for its own memory:
// the range (the backing handle, as for any VMM memory), the context (the
// one current at allocation, as for cuMemAlloc memory) and, for
// stream-ordered memory, the pool (the device's default pool, as natively).
// Everything else is the driver's answer about the VMM mapping.
void PatchAttribute(const Runtime& rt, const vmmshim::PointerInfo& info,
                    CUpointer_attribute attribute, void* data) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      if (info.stream_ordered) {
        *static_cast<CUmemoryPool*>(data) = rt.core->stream_ordered().DefaultPool(info.device);
      }
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = info.range_base;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = info.range_size;
      break;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = info.context;
      break;
    default:
      break;
  }
}

}  // namespace

VMMSHIM_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                              CUdeviceptr ptr) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = rt->driver.cuPointerGetAttribute(data, attribute, ptr);
  if (!rt->enabled() || data == nullptr) return r;
  if (r != CUDA_SUCCESS && attribute != CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) return r;
  if (absl::StatusOr<vmmshim::PointerInfo> info = rt->allocator->Find(ptr); info.ok()) {
    // The driver knows no pool for VMM memory; the shim's stream-ordered
    // memory has one.
    if (r != CUDA_SUCCESS && !info->stream_ordered) return r;
    PatchAttribute(*rt, *info, attribute, data);
    return CUDA_SUCCESS;
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuPointerGetAttributes(unsigned int count,
                                               CUpointer_attribute* attributes, void** data,
                                               CUdeviceptr ptr) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = rt->driver.cuPointerGetAttributes(count, attributes, data, ptr);
  if (r != CUDA_SUCCESS || !rt->enabled()) return r;
  if (absl::StatusOr<vmmshim::PointerInfo> info = rt->allocator->Find(ptr); info.ok()) {
    for (unsigned int i = 0; i < count; ++i) {
      if (data[i] != nullptr) PatchAttribute(*rt, *info, attributes[i], data[i]);
    }
  }
  return r;
}

// ---- Stream-ordered free of shim memory ----

namespace {

// cuMemFreeAsync: shim memory goes to core (Allocator::FreeAsync states
// what it does, also during stream captures); other pointers (stream-ordered
// pools) go to the driver.
CUresult FreeAsync(const Runtime& rt, CUdeviceptr dptr, CUstream stream, bool per_thread,
                   uint16_t library) {
  const vmmshim::DriverApi& d = rt.driver;
  auto real = per_thread ? d.cuMemFreeAsync_ptsz : d.cuMemFreeAsync;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (!rt.enabled() || dptr == 0) return real(dptr, stream);
  const std::optional<vmmshim::PointerInfo> before = vmmshim::BeforeFree(rt, dptr);
  absl::Status freed = rt.allocator->FreeAsync(dptr, stream, per_thread);
  if (vmmshim::IsNotShimMemory(freed)) return real(dptr, stream);
  if (!freed.ok()) return ToCuResult(freed);
  Trace(rt, "free", 0, dptr);
  vmmshim::NoteFree(rt, before, library, stream);
  return CUDA_SUCCESS;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return FreeAsync(*rt, dptr, stream, false,
                   // Only when recording, and never in a forked child (locks
                   // it inherited may be held).
                   rt->enabled() && vmmshim::Recording(*rt) ? VMMSHIM_CALLER_LIBRARY(*rt)
                                                            : uint16_t{0});
}

VMMSHIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return FreeAsync(*rt, dptr, stream, true,
                   rt->enabled() && vmmshim::Recording(*rt) ? VMMSHIM_CALLER_LIBRARY(*rt)
                                                            : uint16_t{0});
}

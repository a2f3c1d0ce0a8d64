// Stream-ordered allocation hooks: cudaMallocAsync / cudaMallocFromPoolAsync
// and the pool calls that must agree with what the shim serves
// (StreamOrderedFrontEnd::AllocateAsync and the pool methods state the rules;
// docs/stream-ordered.md). cuMemFreeAsync is in hooks_memory.cc. Arguments
// the driver would reject (NULL out-pointers, size 0, a NULL pool) and every
// call the shim does not serve go to the real driver, so the application
// gets the driver's own codes.
#include "core/driver/cu_status.h"
#include "core/base/log.h"
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Log;
using vmmshim::Runtime;
using vmmshim::ToCuResult;
using vmmshim::Trace;

namespace {

// `pool` nullptr: cuMemAllocAsync (the current pool). `real` makes the
// call the shim does not serve.
template <typename Real>
CUresult AllocAsync(const Runtime& rt, CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                    CUstream stream, bool per_thread, uint16_t library, Real real) {
  absl::StatusOr<vmmshim::Allocator::Allocation> a =
      rt.core->stream_ordered().AllocateAsync(bytes, stream, per_thread, pool,
                                                   vmmshim::AllocationTag(), library);
  if (!a.ok()) {
    Log().debug("cuMemAllocAsync({}) -> {}", bytes, a.status().ToString());
    *dptr = 0;  // as the driver does on failure (measured: 1 PiB gives 2 and 0)
    vmmshim::NoteAllocationFailed(rt, a.status(), "cuMemAllocAsync", bytes, library);
    return ToCuResult(a.status());
  }
  if (!a->served) {
    CUresult r = real();
    if (r == CUDA_SUCCESS) rt.core->counters().PassThrough(bytes);
    return r;
  }
  *dptr = a->ptr;
  vmmshim::ArmExitRelease();
  Trace(rt, "alloc_async", bytes, a->ptr);
  vmmshim::NoteAllocation(rt, a->device, a->ptr, bytes, library, stream);
  return CUDA_SUCCESS;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  auto real = rt->driver.cuMemAllocAsync;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (!rt->enabled() || dptr == nullptr || bytes == 0) return real(dptr, bytes, stream);
  return AllocAsync(*rt, dptr, bytes, nullptr, stream, false, VMMSHIM_CALLER_LIBRARY(*rt),
                    [&] { return real(dptr, bytes, stream); });
}

VMMSHIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  auto real = rt->driver.cuMemAllocAsync_ptsz;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (!rt->enabled() || dptr == nullptr || bytes == 0) return real(dptr, bytes, stream);
  return AllocAsync(*rt, dptr, bytes, nullptr, stream, true, VMMSHIM_CALLER_LIBRARY(*rt),
                    [&] { return real(dptr, bytes, stream); });
}

VMMSHIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes,
                                                CUmemoryPool pool, CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  auto real = rt->driver.cuMemAllocFromPoolAsync;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (!rt->enabled() || dptr == nullptr || bytes == 0 || pool == nullptr) {
    return real(dptr, bytes, pool, stream);
  }
  return AllocAsync(*rt, dptr, bytes, pool, stream, false, VMMSHIM_CALLER_LIBRARY(*rt),
                    [&] { return real(dptr, bytes, pool, stream); });
}

VMMSHIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes,
                                                     CUmemoryPool pool, CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  auto real = rt->driver.cuMemAllocFromPoolAsync_ptsz;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (!rt->enabled() || dptr == nullptr || bytes == 0 || pool == nullptr) {
    return real(dptr, bytes, pool, stream);
  }
  return AllocAsync(*rt, dptr, bytes, pool, stream, true, VMMSHIM_CALLER_LIBRARY(*rt),
                    [&] { return real(dptr, bytes, pool, stream); });
}

// ---- The default pool's state: access, attributes, trim, current pool ----

VMMSHIM_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map,
                                           size_t count) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuMemPoolSetAccess == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  // The driver validates and keeps the pool's own state (so that
  // cuMemPoolGetAccess answers as it would); the shim then grants its
  // stream-ordered memory of that pool per allocation.
  CUresult r = rt->driver.cuMemPoolSetAccess(pool, map, count);
  if (r != CUDA_SUCCESS || !rt->enabled()) return r;
  return ToCuResult(rt->core->stream_ordered().PoolAccessChanged(pool, map, count));
}

VMMSHIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                              void* value) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuMemPoolGetAttribute == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = rt->driver.cuMemPoolGetAttribute(pool, attr, value);
  if (r != CUDA_SUCCESS || !rt->enabled() || value == nullptr) return r;
  switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      break;
    default:
      return r;
  }
  std::optional<vmmshim::StreamOrderedFigures> f = rt->core->stream_ordered().PoolFigures(pool);
  if (!f) return r;
  // The driver's part (memory the shim did not serve) plus the shim's. A
  // high mark is the sum of the two high marks: never below the true one.
  auto* out = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *out += f->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *out += f->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *out += f->used; break;
    default: *out += f->used_high; break;
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                              void* value) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuMemPoolSetAttribute == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = rt->driver.cuMemPoolSetAttribute(pool, attr, value);
  if (r == CUDA_SUCCESS && rt->enabled()) rt->core->stream_ordered().PoolAttributeSet(pool, attr, value);
  return r;
}

VMMSHIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuMemPoolTrimTo == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = rt->driver.cuMemPoolTrimTo(pool, min_bytes_to_keep);
  if (r == CUDA_SUCCESS && rt->enabled()) rt->core->stream_ordered().PoolTrimTo(pool, min_bytes_to_keep);
  return r;
}

VMMSHIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice device, CUmemoryPool pool) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuDeviceSetMemPool == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = rt->driver.cuDeviceSetMemPool(device, pool);
  if (r == CUDA_SUCCESS && rt->enabled()) rt->core->stream_ordered().CurrentPoolChanged(device, pool);
  return r;
}

VMMSHIM_EXPORT CUresult cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type,
                                        CUmemoryPool pool) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuMemSetMemPool == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = rt->driver.cuMemSetMemPool(location, type, pool);
  if (r == CUDA_SUCCESS && rt->enabled() && location != nullptr &&
      location->type == CU_MEM_LOCATION_TYPE_DEVICE && type == CU_MEM_ALLOCATION_TYPE_PINNED) {
    rt->core->stream_ordered().CurrentPoolChanged(location->id, pool);
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuStreamDestroy_v2 == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  // Before the handle is gone: blocks freed on it get one last event.
  if (rt->enabled()) rt->core->stream_ordered().StreamDestroyed(stream);
  return rt->driver.cuStreamDestroy_v2(stream);
}

// ---- The program's synchronizations: freed blocks ready, threshold applied ----
// (core/stream_ordered/stream_ordered_cache.h, step 3). One atomic load when nothing waits.

namespace {

template <typename Real>
CUresult SynchronizeStream(const Runtime& rt, Real real, CUstream stream, bool per_thread) {
  const uint64_t mark = rt.enabled() ? vmmshim::StreamOrderedFrontEnd::SynchronizeMark() : 0;
  const CUresult r = real(stream);
  if (r == CUDA_SUCCESS && mark != 0) rt.core->stream_ordered().StreamSynchronized(stream, per_thread, mark);
  return r;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuStreamSynchronize == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return SynchronizeStream(*rt, rt->driver.cuStreamSynchronize, stream, false);
}

VMMSHIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuStreamSynchronize_ptsz == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return SynchronizeStream(*rt, rt->driver.cuStreamSynchronize_ptsz, stream, true);
}

VMMSHIM_EXPORT CUresult cuCtxSynchronize() {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const uint64_t mark = rt->enabled() ? vmmshim::StreamOrderedFrontEnd::SynchronizeMark() : 0;
  const CUresult r = rt->driver.cuCtxSynchronize();
  if (r == CUDA_SUCCESS && mark != 0) rt->core->stream_ordered().ContextSynchronized(nullptr, mark);
  return r;
}

VMMSHIM_EXPORT CUresult cuCtxSynchronize_v2(CUcontext context) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (rt->driver.cuCtxSynchronize_v2 == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const uint64_t mark = rt->enabled() ? vmmshim::StreamOrderedFrontEnd::SynchronizeMark() : 0;
  const CUresult r = rt->driver.cuCtxSynchronize_v2(context);
  if (r == CUDA_SUCCESS && mark != 0) rt->core->stream_ordered().ContextSynchronized(context, mark);
  return r;
}

// Exported driver hooks. Thin on purpose: guard, call core/, translate the
// status to a CUresult. Arguments the driver would reject (NULL
// out-pointers, size 0, bad element sizes) go to the real driver, so the
// application gets exactly the driver's code for them.
#include "interpose/hooks.h"

#include <atomic>
#include <cstring>
#include <string>

#include "core/cu_status.h"
#include "core/ipc_handle.h"
#include "core/log.h"
#include "interpose/runtime.h"
#include "vmmshim/vmmshim.h"

// cuda.h maps cuGetProcAddress to cuGetProcAddress_v2; the 4-argument
// cuGetProcAddress is a distinct export of the driver that we hook too.
#undef cuGetProcAddress

#define VMMSHIM_EXPORT extern "C" __attribute__((visibility("default")))

using vmmshim::GetRuntime;
using vmmshim::Log;
using vmmshim::Runtime;
using vmmshim::ToCuResult;

namespace {

// One-line notices at the first occurrence, not per call.
void NoticeOnce(std::atomic<bool>& flag, const char* message) {
  if (!flag.exchange(true, std::memory_order_relaxed)) Log().info("{}", message);
}
std::atomic<bool> g_alloc_notice{false};
std::atomic<bool> g_free_notice{false};

// vmmshim_set_allocation_tag: this thread's tag for its next allocations.
thread_local std::string t_allocation_tag;

// VMMSHIM_TRACE_FILE: records a successful allocation or free.
void Trace(const Runtime& rt, const char* op, size_t bytes, CUdeviceptr ptr) {
  if (rt.trace == nullptr) return;
  CUdevice device = -1;
  rt.driver.cuCtxGetDevice(&device);
  rt.trace->Record(device, op, bytes, ptr);
}

// The device of `ctx` (cuCtxGetDevice on it, made current for the query).
CUresult ContextDevice(const Runtime& rt, CUcontext ctx, CUdevice* device) {
  CUresult r = rt.driver.cuCtxPushCurrent_v2(ctx);
  if (r != CUDA_SUCCESS) return r;
  r = rt.driver.cuCtxGetDevice(device);
  CUcontext popped;
  rt.driver.cuCtxPopCurrent_v2(&popped);
  return r;
}

void* Substitute(const Runtime& rt, void* real_fn) {
  if (!rt.enabled()) {
    // Pass-through still answers the resolver self-lookup with the real
    // resolver, so later lookups bypass the shim entirely.
    return real_fn;
  }
  const char* name = rt.driver.NameOf(real_fn);
  if (name == nullptr) return real_fn;
  void* hook = vmmshim::HookFor(name);
  return hook != nullptr ? hook : real_fn;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* symbol_status) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || rt->driver.cuGetProcAddress_v2 == nullptr) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  // The real resolver first, with the caller's arguments: its errors, NULL
  // answers and status pass through unchanged; only an answer that is
  // exactly the address of a hooked export is replaced.
  CUresult r = rt->driver.cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, symbol_status);
  if (r == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) {
    void* real = *pfn;
    *pfn = Substitute(*rt, *pfn);
    Log().trace("cuGetProcAddress_v2({}, {}, {:#x}) -> {}", symbol != nullptr ? symbol : "?",
                cuda_version, flags, *pfn != real ? "hooked" : "driver");
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                         cuuint64_t flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || rt->driver.cuGetProcAddress == nullptr) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  CUresult r = rt->driver.cuGetProcAddress(symbol, pfn, cuda_version, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) *pfn = Substitute(*rt, *pfn);
  return r;
}

VMMSHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled() || dptr == nullptr || bytesize == 0) {
    return rt->driver.cuMemAlloc_v2(dptr, bytesize);
  }
  absl::StatusOr<vmmshim::Allocator::Allocation> a =
      rt->allocator->Allocate(bytesize, t_allocation_tag);
  if (!a.ok()) {
    Log().debug("cuMemAlloc({}) -> {}", bytesize, a.status().ToString());
    *dptr = 0;  // as the driver does on failure (seen on H200: OOM leaves 0)
    return ToCuResult(a.status());
  }
  if (!a->served) {
    NoticeOnce(g_alloc_notice,
               "an allocation went to the driver (no current context, or a device without "
               "VMM support); further ones are counted in the exit report");
    CUresult r = rt->driver.cuMemAlloc_v2(dptr, bytesize);
    if (r == CUDA_SUCCESS) {
      rt->allocator->NotePassThrough(bytesize);
      Trace(*rt, "alloc", bytesize, *dptr);
    }
    return r;
  }
  *dptr = a->ptr;
  vmmshim::ArmExitRelease();
  Trace(*rt, "alloc", bytesize, a->ptr);
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
  absl::StatusOr<vmmshim::Allocator::Allocation> a =
      rt->allocator->AllocatePitch(width, height, pitch, t_allocation_tag);
  if (!a.ok()) {
    *dptr = 0;
    return ToCuResult(a.status());
  }
  if (!a->served) {
    CUresult r = rt->driver.cuMemAllocPitch_v2(dptr, pitch, width, height, element_size);
    if (r == CUDA_SUCCESS) rt->allocator->NotePassThrough(*pitch * height);
    return r;
  }
  *dptr = a->ptr;
  vmmshim::ArmExitRelease();
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled() || dptr == 0) return rt->driver.cuMemFree_v2(dptr);
  absl::Status freed = rt->allocator->Free(dptr);
  if (vmmshim::IsNotShimMemory(freed)) {
    NoticeOnce(g_free_notice,
               "a pointer not allocated by vmmshim was freed through the driver (allocated "
               "before the shim took over, or passed through); further ones are not logged");
    CUresult r = rt->driver.cuMemFree_v2(dptr);
    if (r == CUDA_SUCCESS) Trace(*rt, "free", 0, dptr);
    return r;
  }
  if (!freed.ok()) return ToCuResult(freed);
  Trace(*rt, "free", 0, dptr);
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = rt->driver.cuMemGetInfo_v2(free, total);
  if (r != CUDA_SUCCESS || !rt->enabled() || free == nullptr) return r;
  // Memory the shim keeps mapped without serving an allocation is free to
  // the application.
  CUdevice device = 0;
  if (rt->driver.cuCtxGetDevice(&device) == CUDA_SUCCESS) {
    *free += rt->allocator->IdleBytes(device);
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
// the range (the backing handle, as for any VMM memory) and the context (the
// one current at allocation, as for cuMemAlloc memory). Everything else is
// the driver's answer about the VMM mapping.
void PatchAttribute(const vmmshim::PointerInfo& info, CUpointer_attribute attribute,
                    void* data) {
  switch (attribute) {
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
  if (r != CUDA_SUCCESS || !rt->enabled()) return r;
  if (absl::StatusOr<vmmshim::PointerInfo> info = rt->allocator->Find(ptr); info.ok()) {
    PatchAttribute(*info, attribute, data);
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
      if (data[i] != nullptr) PatchAttribute(*info, attributes[i], data[i]);
    }
  }
  return r;
}

// cudaDeviceEnablePeerAccess arrives here: the current context asks for
// access to `peer`'s memory. With VMMSHIM_PEER_ENABLE_DRIVER=1 (default) the
// driver decides and its code is returned unchanged; only then are the
// policy's VMM grants made (and undone again if they fail). With 0, the shim
// keeps the driver's per-pair state and codes itself.
VMMSHIM_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled()) return rt->driver.cuCtxEnablePeerAccess(peer, flags);
  CUcontext current = nullptr;
  CUdevice me = 0, owner = 0;
  if (rt->config.peer_enable_driver) {
    CUresult r = rt->driver.cuCtxEnablePeerAccess(peer, flags);
    if (r != CUDA_SUCCESS) return r;
    if (rt->driver.cuCtxGetDevice(&me) != CUDA_SUCCESS ||
        ContextDevice(*rt, peer, &owner) != CUDA_SUCCESS) {
      return CUDA_SUCCESS;  // the driver accepted it; nothing of ours to grant
    }
    absl::Status granted = rt->allocator->EnablePeer(me, owner);
    if (!granted.ok()) {
      Log().error("granting peer {} access to device {} failed: {}", me, owner,
                  granted.ToString());
      rt->driver.cuCtxDisablePeerAccess(peer);
      return ToCuResult(granted);
    }
    return CUDA_SUCCESS;
  }
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (rt->driver.cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr ||
      peer == nullptr) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (CUresult r = rt->driver.cuCtxGetDevice(&me); r != CUDA_SUCCESS) return r;
  if (CUresult r = ContextDevice(*rt, peer, &owner); r != CUDA_SUCCESS) return r;
  int can = 0;
  if (CUresult r = rt->driver.cuDeviceCanAccessPeer(&can, me, owner); r != CUDA_SUCCESS) {
    return r;
  }
  if (can == 0) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (CUresult r = rt->peer_contexts.Enable(current, peer); r != CUDA_SUCCESS) return r;
  absl::Status granted = rt->allocator->EnablePeer(me, owner);
  if (!granted.ok()) rt->peer_contexts.Disable(current, peer);
  return ToCuResult(granted);
}

VMMSHIM_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt->enabled()) return rt->driver.cuCtxDisablePeerAccess(peer);
  CUcontext current = nullptr;
  CUdevice me = 0, owner = 0;
  if (rt->config.peer_enable_driver) {
    CUresult r = rt->driver.cuCtxDisablePeerAccess(peer);
    if (r != CUDA_SUCCESS) return r;
  } else {
    if (rt->driver.cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr ||
        peer == nullptr) {
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    CUresult r = rt->peer_contexts.Disable(current, peer);
    if (r != CUDA_SUCCESS) return r;
  }
  if (rt->driver.cuCtxGetDevice(&me) == CUDA_SUCCESS &&
      ContextDevice(*rt, peer, &owner) == CUDA_SUCCESS) {
    absl::Status revoked = rt->allocator->DisablePeer(me, owner);
    if (!revoked.ok()) Log().warn("revoking peer {} access to device {}: {}", me, owner,
                                  revoked.ToString());
  }
  return CUDA_SUCCESS;
}

// ---- IPC (core/ipc.h) ----

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

// ---- Context lifecycle ----

namespace {

// The primary context of `device` when it is active, leaving its reference
// count as it was; nullptr when it is inactive (nothing of it can be held).
CUcontext ActivePrimaryContext(const Runtime& rt, CUdevice device) {
  const vmmshim::DriverApi& d = rt.driver;
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

void ReleaseContextMemory(const Runtime& rt, CUcontext ctx, bool synchronize,
                          const char* why) {
  const size_t released = rt.allocator->ReleaseContext(ctx, synchronize);
  if (rt.ipc != nullptr) rt.ipc->ReleaseContext(ctx);
  if (released > 0) Log().info("{}: released {} bytes of device memory", why, released);
}

}  // namespace

namespace {

// cudaDeviceReset arrives here: the driver frees the primary context's
// cuMemAlloc memory, but VMM memory belongs to no context, so the shim
// releases what it served in that context first (synchronized). The _v2
// (cudaVersion 11000) and the original (7000) entry points share one ABI;
// cudart resolves both. `real` is the driver's function of the caller's
// version.
CUresult PrimaryCtxReset(const Runtime& rt, PFN_cuDevicePrimaryCtxReset_v11000 real,
                         CUdevice device) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt.enabled()) return real(device);
  CUcontext ctx = ActivePrimaryContext(rt, device);
  Log().debug("cuDevicePrimaryCtxReset({}): primary context {}", device, static_cast<void*>(ctx));
  if (ctx != nullptr) ReleaseContextMemory(rt, ctx, true, "cuDevicePrimaryCtxReset");
  CUresult r = real(device);
  rt.allocator->ForgetContext(ctx);
  return r;
}

// The last release destroys the primary context: then its memory goes too.
CUresult PrimaryCtxRelease(const Runtime& rt, PFN_cuDevicePrimaryCtxRelease_v11000 real,
                           CUdevice device) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rt.enabled()) return real(device);
  CUcontext ctx = ActivePrimaryContext(rt, device);
  CUresult r = real(device);
  Log().debug("cuDevicePrimaryCtxRelease({}): primary context {} -> {}", device,
              static_cast<void*>(ctx), static_cast<int>(r));
  if (r != CUDA_SUCCESS || ctx == nullptr) return r;
  unsigned int flags = 0;
  int active = 1;
  if (rt.driver.cuDevicePrimaryCtxGetState(device, &flags, &active) == CUDA_SUCCESS &&
      active == 0) {
    ReleaseContextMemory(rt, ctx, false, "cuDevicePrimaryCtxRelease (last reference)");
  }
  return r;
}

CUresult CtxDestroy(const Runtime& rt, PFN_cuCtxDestroy_v4000 real, CUcontext ctx) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(ctx);
  // The driver waited for the context's work before destroying it.
  if (r == CUDA_SUCCESS && rt.enabled()) ReleaseContextMemory(rt, ctx, false, "cuCtxDestroy");
  return r;
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

// ---- Stream-ordered free of shim memory ----

namespace {

// cuMemFreeAsync: shim memory goes to core (Allocator::FreeAsync states
// what it does, also during stream captures); other pointers (stream-ordered
// pools) go to the driver.
CUresult FreeAsync(const Runtime& rt, CUdeviceptr dptr, CUstream stream, bool per_thread) {
  const vmmshim::DriverApi& d = rt.driver;
  auto real = per_thread ? d.cuMemFreeAsync_ptsz : d.cuMemFreeAsync;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (!rt.enabled() || dptr == 0) return real(dptr, stream);
  absl::Status freed = rt.allocator->FreeAsync(dptr, stream, per_thread);
  if (vmmshim::IsNotShimMemory(freed)) return real(dptr, stream);
  if (!freed.ok()) return ToCuResult(freed);
  Trace(rt, "free", 0, dptr);
  return CUDA_SUCCESS;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return FreeAsync(*rt, dptr, stream, false);
}

VMMSHIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return FreeAsync(*rt, dptr, stream, true);
}

// ---- Stream capture: the allocator follows which captures are in progress
// (core/capture.h), so that allocations and frees during one get the
// driver's codes and a free never synchronizes a capturing context. ----

namespace {

template <typename Real, typename... Args>
CUresult BeginCapture(const Runtime* rt, Real real, bool per_thread, CUstream stream,
                      Args... args) {
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(stream, args...);
  if (r == CUDA_SUCCESS && rt->enabled()) rt->allocator->captures().Began(stream, per_thread);
  return r;
}

template <typename Real>
CUresult EndCapture(const Runtime* rt, Real real, bool per_thread, CUstream stream,
                    CUgraph* graph) {
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(stream, graph);
  if (rt->enabled()) rt->allocator->captures().Ended(stream, per_thread);
  return r;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return BeginCapture(rt, rt->driver.cuStreamBeginCapture_v2, false, stream, mode);
}

VMMSHIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return BeginCapture(rt, rt->driver.cuStreamBeginCapture_v2_ptsz, true, stream, mode);
}

VMMSHIM_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph,
                                                    const CUgraphNode* deps,
                                                    const CUgraphEdgeData* edges, size_t count,
                                                    CUstreamCaptureMode mode) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return BeginCapture(rt, rt->driver.cuStreamBeginCaptureToGraph, false, stream, graph, deps,
                      edges, count, mode);
}

VMMSHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                                         const CUgraphNode* deps,
                                                         const CUgraphEdgeData* edges,
                                                         size_t count, CUstreamCaptureMode mode) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return BeginCapture(rt, rt->driver.cuStreamBeginCaptureToGraph_ptsz, true, stream, graph,
                      deps, edges, count, mode);
}

VMMSHIM_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return EndCapture(rt, rt->driver.cuStreamEndCapture, false, stream, graph);
}

VMMSHIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return EndCapture(rt, rt->driver.cuStreamEndCapture_ptsz, true, stream, graph);
}

// ---- Public API (include/vmmshim/vmmshim.h) ----

namespace {
CUresult ExplicitAccess(const void* ptr, int peer, bool grant) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  return ToCuResult(grant ? rt->allocator->GrantPeer(p, peer) : rt->allocator->RevokePeer(p, peer));
}
}  // namespace

VMMSHIM_EXPORT int vmmshim_grant_peer_access(const void* ptr, int peer_device) {
  return ExplicitAccess(ptr, peer_device, true);
}

VMMSHIM_EXPORT int vmmshim_revoke_peer_access(const void* ptr, int peer_device) {
  return ExplicitAccess(ptr, peer_device, false);
}

VMMSHIM_EXPORT int vmmshim_query_peer_access(const void* ptr, int peer_device,
                                             int* has_access) {
  if (has_access == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  absl::StatusOr<bool> has =
      rt->allocator->PeerHasAccess(reinterpret_cast<CUdeviceptr>(ptr), peer_device);
  if (!has.ok()) return ToCuResult(has.status());
  *has_access = *has ? 1 : 0;
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_release_cached_memory(int device, size_t* released_bytes) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  if (device < -1 || device >= vmmshim::Allocator::kMaxDevices) return CUDA_ERROR_INVALID_DEVICE;
  const size_t released = rt->allocator->Trim(device);
  if (released_bytes != nullptr) *released_bytes = released;
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_set_allocation_tag(const char* tag) {
  if (tag != nullptr && std::strlen(tag) > 255) return CUDA_ERROR_INVALID_VALUE;
  t_allocation_tag = tag != nullptr ? tag : "";
  return CUDA_SUCCESS;
}

namespace vmmshim {
namespace {

struct HookEntry {
  const char* name;  // the driver export whose ABI the hook implements
  void* hook;
};

// Keep in step with interpose/vmmshim.map (a test compares the exports).
const HookEntry kHooks[] = {
    {"cuGetProcAddress", reinterpret_cast<void*>(&::cuGetProcAddress)},
    {"cuGetProcAddress_v2", reinterpret_cast<void*>(&::cuGetProcAddress_v2)},
    {"cuMemAlloc_v2", reinterpret_cast<void*>(&::cuMemAlloc_v2)},
    {"cuMemAllocPitch_v2", reinterpret_cast<void*>(&::cuMemAllocPitch_v2)},
    {"cuMemFree_v2", reinterpret_cast<void*>(&::cuMemFree_v2)},
    {"cuMemGetInfo_v2", reinterpret_cast<void*>(&::cuMemGetInfo_v2)},
    {"cuMemGetAddressRange_v2", reinterpret_cast<void*>(&::cuMemGetAddressRange_v2)},
    {"cuPointerGetAttribute", reinterpret_cast<void*>(&::cuPointerGetAttribute)},
    {"cuPointerGetAttributes", reinterpret_cast<void*>(&::cuPointerGetAttributes)},
    {"cuCtxEnablePeerAccess", reinterpret_cast<void*>(&::cuCtxEnablePeerAccess)},
    {"cuCtxDisablePeerAccess", reinterpret_cast<void*>(&::cuCtxDisablePeerAccess)},
    {"cuIpcGetMemHandle", reinterpret_cast<void*>(&::cuIpcGetMemHandle)},
    {"cuIpcOpenMemHandle_v2", reinterpret_cast<void*>(&::cuIpcOpenMemHandle_v2)},
    {"cuIpcOpenMemHandle", reinterpret_cast<void*>(&::cuIpcOpenMemHandle)},
    {"cuIpcCloseMemHandle", reinterpret_cast<void*>(&::cuIpcCloseMemHandle)},
    {"cuDevicePrimaryCtxReset_v2", reinterpret_cast<void*>(&::cuDevicePrimaryCtxReset_v2)},
    {"cuDevicePrimaryCtxRelease_v2", reinterpret_cast<void*>(&::cuDevicePrimaryCtxRelease_v2)},
    {"cuCtxDestroy_v2", reinterpret_cast<void*>(&::cuCtxDestroy_v2)},
    {"cuCtxDestroy", reinterpret_cast<void*>(&::cuCtxDestroy)},
    {"cuDevicePrimaryCtxReset", reinterpret_cast<void*>(&::cuDevicePrimaryCtxReset)},
    {"cuDevicePrimaryCtxRelease", reinterpret_cast<void*>(&::cuDevicePrimaryCtxRelease)},
    {"cuMemFreeAsync", reinterpret_cast<void*>(&::cuMemFreeAsync)},
    {"cuMemFreeAsync_ptsz", reinterpret_cast<void*>(&::cuMemFreeAsync_ptsz)},
    {"cuStreamBeginCapture_v2", reinterpret_cast<void*>(&::cuStreamBeginCapture_v2)},
    {"cuStreamBeginCapture_v2_ptsz", reinterpret_cast<void*>(&::cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamBeginCaptureToGraph", reinterpret_cast<void*>(&::cuStreamBeginCaptureToGraph)},
    {"cuStreamBeginCaptureToGraph_ptsz",
     reinterpret_cast<void*>(&::cuStreamBeginCaptureToGraph_ptsz)},
    {"cuStreamEndCapture", reinterpret_cast<void*>(&::cuStreamEndCapture)},
    {"cuStreamEndCapture_ptsz", reinterpret_cast<void*>(&::cuStreamEndCapture_ptsz)},
};

}  // namespace

void* HookFor(const char* versioned_name) {
  for (const HookEntry& e : kHooks) {
    if (std::strcmp(e.name, versioned_name) == 0) return e.hook;
  }
  return nullptr;
}

}  // namespace vmmshim

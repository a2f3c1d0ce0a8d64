// What the shim does around the driver's context-lifecycle calls, so that
// the memory it served in a context goes when the driver frees that
// context's cuMemAlloc memory (docs/architecture.md, "IPC, context lifecycle and fork").
//
// VMM memory belongs to no context: the driver frees a context's cuMemAlloc
// memory when the context is destroyed or reset, but not the VMM handles the
// shim mapped for it. These functions wrap the real call of the caller's ABI
// version (`real`: the driver's cuDevicePrimaryCtxReset_v2 or
// cuDevicePrimaryCtxReset, which share one ABI, and likewise for Release and
// cuCtxDestroy) and release the shim's memory of that context
// (Allocator::ReleaseContext, and Ipc::ReleaseContext for the imports opened
// in it) at the point where the driver frees its own:
//   - PrimaryCtxReset: before the reset, synchronized (the context is still
//     alive and may have work queued that uses the memory); then
//     the allocator forgets the context (Allocator::ReleaseContext), since
//     the handle may come back as a new
//     context.
//   - PrimaryCtxRelease: after a successful release that left the primary
//     context inactive (the last reference), unsynchronized (the driver
//     waited for its work when it destroyed it). A release of a reference
//     that is not the last keeps everything.
//   - CtxDestroy: after a successful destroy, unsynchronized (as above).
//
// Errors: the real function's CUresult, unchanged; nothing is released when
// a destroy or release fails. CUDA_ERROR_NOT_INITIALIZED when `real` is
// nullptr (the driver lacks that entry point), without calling anything.
// A reset releases the shim's memory even when the real reset then fails (as
// before this file existed: the driver reports failure only for an invalid
// device, which has no primary context to release).
//
// Thread safety: the functions may be called concurrently; they use only
// the thread-safe methods of Allocator and Ipc. ActivePrimaryContext's
// retain/release pair is not atomic with other threads' primary-context
// calls: the driver gives no way to read the handle without a retain.
//
// Source of the behaviour: measured on an H200 (docs/architecture.md,
// "Measured driver facts": cudaDeviceReset -> cuDevicePrimaryCtxReset;
// exit-time cuDevicePrimaryCtxRelease_v2 returns CUDA_ERROR_DEINITIALIZED,
// which passes through).
#ifndef VMMSHIM_CORE_LIFECYCLE_CONTEXT_LIFECYCLE_H_
#define VMMSHIM_CORE_LIFECYCLE_CONTEXT_LIFECYCLE_H_

#include <cuda.h>

#include "core/allocator.h"
#include "core/driver/context.h"
#include "core/driver/driver_api.h"
#include "core/ipc/ipc.h"

namespace vmmshim {


// The shim's part of the context calls. Holds references only: `driver`,
// `allocator` (and `ipc` when not nullptr, i.e. VMMSHIM_IPC=1) must outlive
// it. Cheap to construct per call.
class ContextLifecycle {
 public:
  ContextLifecycle(const DriverApi& driver, Allocator& allocator, Ipc* ipc)
      : driver_(driver), allocator_(allocator), ipc_(ipc) {}

  // cuDevicePrimaryCtxReset(_v2), cudaDeviceReset: releases the shim's memory
  // of the active primary context of `device` (synchronizing it first), then
  // calls `real(device)`, then forgets the context. Returns real's code.
  CUresult PrimaryCtxReset(PFN_cuDevicePrimaryCtxReset_v11000 real, CUdevice device) const;

  // cuDevicePrimaryCtxRelease(_v2): calls `real(device)`; when it succeeded
  // and the primary context was active before and is inactive after, releases
  // the shim's memory of it without synchronizing. Returns real's code.
  CUresult PrimaryCtxRelease(PFN_cuDevicePrimaryCtxRelease_v11000 real, CUdevice device) const;

  // cuCtxDestroy(_v2): calls `real(ctx)`; on success releases the shim's
  // memory of `ctx` without synchronizing. Returns real's code.
  CUresult CtxDestroy(PFN_cuCtxDestroy_v4000 real, CUcontext ctx) const;

 private:
  // Allocator::ReleaseContext and Ipc::ReleaseContext; logs what went.
  void ReleaseContextMemory(CUcontext ctx, bool synchronize, const char* why) const;

  const DriverApi& driver_;
  Allocator& allocator_;
  Ipc* ipc_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_LIFECYCLE_CONTEXT_LIFECYCLE_H_

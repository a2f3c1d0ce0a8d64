// The one table through which vmmshim reaches the CUDA driver.
//
// Every driver entry point the project calls is listed once, in
// VMMSHIM_DRIVER_ENTRY_POINTS, with the exported symbol that implements the
// ABI we call (for example cuMemAlloc_v2, not the 32-bit cuMemAlloc) and its
// function-pointer type from <cudaTypedefs.h>, whose suffix names the CUDA
// version that introduced that ABI. This follows NCCL's cudawrap: the types
// come from NVIDIA's header, so a wrong ABI fails to compile.
//
// Two fillers exist: LoadDriverApi() resolves the real libcuda.so.1 (or
// whatever libcuda.so.1 the dynamic loader finds, e.g. the simulated driver in
// end-to-end tests); tests/sim fills the table with the simulated driver's
// functions for unit tests. core/ never resolves a driver symbol itself.
//
// Thread safety: a filled DriverApi is immutable and may be read from any
// thread. Ownership: LoadDriverApi() keeps its dlopen handle for the life of
// the process (libcuda is never unloaded; unloading it under live
// allocations would crash the program at exit).
#ifndef VMMSHIM_CORE_DRIVER_DRIVER_API_H_
#define VMMSHIM_CORE_DRIVER_DRIVER_API_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/driver/work_submission.h"

// cuda.h maps cuGetProcAddress to cuGetProcAddress_v2, but the driver exports
// both, with different ABIs (4 and 5 arguments); in vmmshim every driver name
// means the exported symbol of that exact name.
#undef cuGetProcAddress
// Likewise for the entry points whose original and _v2 exports share one
// ABI and are both resolved by cudart (cudaVersion 2000/7000/4010 and later);
// their table entries use the _v2 function types (cudaTypedefs.h declares
// the older ones only for the driver's own build).
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuIpcOpenMemHandle
// cuda.h maps these to their _v2 / per-thread names; the table names exports.
#undef cuStreamBeginCapture
#undef cuStreamEndCapture
#undef cuStreamBeginCaptureToGraph

namespace vmmshim {

// X(member, exported symbol, PFN type, required)
// required == false: the table still loads when the symbol is missing (older
// drivers); callers check the pointer for nullptr.
#define VMMSHIM_DRIVER_ENTRY_POINTS(X)                                                \
  X(cuInit, "cuInit", PFN_cuInit_v2000, true)                                          \
  X(cuDriverGetVersion, "cuDriverGetVersion", PFN_cuDriverGetVersion_v2020, true)      \
  X(cuGetErrorName, "cuGetErrorName", PFN_cuGetErrorName_v6000, true)                  \
  X(cuGetProcAddress, "cuGetProcAddress", PFN_cuGetProcAddress_v11030, false)          \
  X(cuGetProcAddress_v2, "cuGetProcAddress_v2", PFN_cuGetProcAddress_v12000, false)    \
  X(cuDeviceGet, "cuDeviceGet", PFN_cuDeviceGet_v2000, true)                           \
  X(cuDeviceGetCount, "cuDeviceGetCount", PFN_cuDeviceGetCount_v2000, true)            \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", PFN_cuDeviceGetAttribute_v2000, true) \
  X(cuDeviceTotalMem_v2, "cuDeviceTotalMem_v2", PFN_cuDeviceTotalMem_v3020, true)      \
  X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", PFN_cuDeviceCanAccessPeer_v4000, true) \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", PFN_cuCtxGetCurrent_v4000, true)               \
  X(cuCtxGetDevice, "cuCtxGetDevice", PFN_cuCtxGetDevice_v2000, true)                  \
  X(cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2", PFN_cuCtxPushCurrent_v4000, true)      \
  X(cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2", PFN_cuCtxPopCurrent_v4000, true)         \
  X(cuCtxSynchronize, "cuCtxSynchronize", PFN_cuCtxSynchronize_v2000, true)            \
  X(cuCtxSynchronize_v2, "cuCtxSynchronize_v2", PFN_cuCtxSynchronize_v13000, false)    \
  X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", PFN_cuCtxEnablePeerAccess_v4000, true) \
  X(cuCtxDisablePeerAccess, "cuCtxDisablePeerAccess", PFN_cuCtxDisablePeerAccess_v4000,  \
    true)                                                                              \
  X(cuMemAlloc_v2, "cuMemAlloc_v2", PFN_cuMemAlloc_v3020, true)                        \
  X(cuMemAllocPitch_v2, "cuMemAllocPitch_v2", PFN_cuMemAllocPitch_v3020, true)         \
  X(cuMemFree_v2, "cuMemFree_v2", PFN_cuMemFree_v3020, true)                           \
  X(cuMemGetInfo_v2, "cuMemGetInfo_v2", PFN_cuMemGetInfo_v3020, true)                  \
  X(cuMemGetAddressRange_v2, "cuMemGetAddressRange_v2",                                \
    PFN_cuMemGetAddressRange_v3020, true)                                              \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", PFN_cuPointerGetAttribute_v4000,   \
    true)                                                                              \
  X(cuPointerGetAttributes, "cuPointerGetAttributes",                                  \
    PFN_cuPointerGetAttributes_v7000, true)                                            \
  X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity",                    \
    PFN_cuMemGetAllocationGranularity_v10020, true)                                    \
  X(cuMemAddressReserve, "cuMemAddressReserve", PFN_cuMemAddressReserve_v10020, true)  \
  X(cuMemAddressFree, "cuMemAddressFree", PFN_cuMemAddressFree_v10020, true)           \
  X(cuMemCreate, "cuMemCreate", PFN_cuMemCreate_v10020, true)                          \
  X(cuMemRelease, "cuMemRelease", PFN_cuMemRelease_v10020, true)                       \
  X(cuMemMap, "cuMemMap", PFN_cuMemMap_v10020, true)                                   \
  X(cuMemUnmap, "cuMemUnmap", PFN_cuMemUnmap_v10020, true)                             \
  X(cuMemSetAccess, "cuMemSetAccess", PFN_cuMemSetAccess_v10020, true)                \
  X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle",                      \
    PFN_cuMemExportToShareableHandle_v10020, false)                                    \
  X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle",                  \
    PFN_cuMemImportFromShareableHandle_v10020, false)                                  \
  X(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle",  \
    PFN_cuMemGetAllocationPropertiesFromHandle_v10020, false)                          \
  X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle",                        \
    PFN_cuMemRetainAllocationHandle_v11000, false)                                     \
  X(cuIpcGetMemHandle, "cuIpcGetMemHandle", PFN_cuIpcGetMemHandle_v4010, false)        \
  X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle_v2", PFN_cuIpcOpenMemHandle_v11000, false) \
  X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", PFN_cuIpcCloseMemHandle_v4010, false)  \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", PFN_cuDevicePrimaryCtxRetain_v7000, \
    false)                                                                             \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2",                      \
    PFN_cuDevicePrimaryCtxRelease_v11000, false)                                       \
  X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset_v2",                          \
    PFN_cuDevicePrimaryCtxReset_v11000, false)                                         \
  X(cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState",                          \
    PFN_cuDevicePrimaryCtxGetState_v7000, false)                                       \
  X(cuCtxGetLimit, "cuCtxGetLimit", PFN_cuCtxGetLimit_v3010, false)                   \
  X(cuCtxSetLimit, "cuCtxSetLimit", PFN_cuCtxSetLimit_v3010, false)                   \
  X(cuCtxDestroy_v2, "cuCtxDestroy_v2", PFN_cuCtxDestroy_v4000, false)                 \
  X(cuCtxDestroy, "cuCtxDestroy", PFN_cuCtxDestroy_v4000, false)                       \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease",                            \
    PFN_cuDevicePrimaryCtxRelease_v11000, false)                                        \
  X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", PFN_cuDevicePrimaryCtxReset_v11000, \
    false)                                                                             \
  X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", PFN_cuIpcOpenMemHandle_v11000, false)     \
  X(cuMemFreeAsync, "cuMemFreeAsync", PFN_cuMemFreeAsync_v11020, false)                \
  X(cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz", PFN_cuMemFreeAsync_v11020_ptsz, false) \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", PFN_cuStreamIsCapturing_v10000, false) \
  X(cuStreamIsCapturing_ptsz, "cuStreamIsCapturing_ptsz",                              \
    PFN_cuStreamIsCapturing_v10000_ptsz, false)                                        \
  X(cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2", PFN_cuStreamBeginCapture_v10010, \
    false)                                                                             \
  X(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture_v2_ptsz",                      \
    PFN_cuStreamBeginCapture_v10010_ptsz, false)                                       \
  X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph",                        \
    PFN_cuStreamBeginCaptureToGraph_v12030, false)                                     \
  X(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph_ptsz",              \
    PFN_cuStreamBeginCaptureToGraph_v12030_ptsz, false)                                \
  X(cuStreamEndCapture, "cuStreamEndCapture", PFN_cuStreamEndCapture_v10000, false)    \
  X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode",            \
    PFN_cuThreadExchangeStreamCaptureMode_v10010, false)                               \
  X(cuStreamEndCapture_ptsz, "cuStreamEndCapture_ptsz", PFN_cuStreamEndCapture_v10000_ptsz, \
    false)                                                                             \
  X(cuStreamSynchronize, "cuStreamSynchronize", PFN_cuStreamSynchronize_v2000, false)  \
  X(cuStreamSynchronize_ptsz, "cuStreamSynchronize_ptsz",                              \
    PFN_cuStreamSynchronize_v7000_ptsz, false)                                         \
  /* stream-ordered allocation (core/stream_ordered/stream_ordered_cache.h) */                              \
  X(cuMemAllocAsync, "cuMemAllocAsync", PFN_cuMemAllocAsync_v11020, false)             \
  X(cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz", PFN_cuMemAllocAsync_v11020_ptsz, false) \
  X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", PFN_cuMemAllocFromPoolAsync_v11020, \
    false)                                                                             \
  X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync_ptsz",                      \
    PFN_cuMemAllocFromPoolAsync_v11020_ptsz, false)                                    \
  X(cuMemPoolSetAccess, "cuMemPoolSetAccess", PFN_cuMemPoolSetAccess_v11020, false)    \
  X(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", PFN_cuMemPoolGetAttribute_v11020, false) \
  X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", PFN_cuMemPoolSetAttribute_v11020, false) \
  X(cuMemPoolTrimTo, "cuMemPoolTrimTo", PFN_cuMemPoolTrimTo_v11020, false)             \
  X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool",                            \
    PFN_cuDeviceGetDefaultMemPool_v11020, false)                                       \
  X(cuDeviceGetMemPool, "cuDeviceGetMemPool", PFN_cuDeviceGetMemPool_v11020, false)    \
  X(cuDeviceSetMemPool, "cuDeviceSetMemPool", PFN_cuDeviceSetMemPool_v11020, false)    \
  X(cuMemSetMemPool, "cuMemSetMemPool", PFN_cuMemSetMemPool_v13000, false)             \
  X(cuStreamQuery, "cuStreamQuery", PFN_cuStreamQuery_v2000, false)                    \
  X(cuStreamGetCtx, "cuStreamGetCtx", PFN_cuStreamGetCtx_v9020, false)                 \
  X(cuStreamDestroy_v2, "cuStreamDestroy_v2", PFN_cuStreamDestroy_v4000, false)        \
  X(cuEventCreate, "cuEventCreate", PFN_cuEventCreate_v2000, false)                    \
  X(cuEventQuery, "cuEventQuery", PFN_cuEventQuery_v2000, false)                       \
  X(cuEventSynchronize, "cuEventSynchronize", PFN_cuEventSynchronize_v2000, false)     \
  X(cuEventDestroy_v2, "cuEventDestroy_v2", PFN_cuEventDestroy_v4000, false)            \
  /* pause and resume: contents to host memory and back (core/heap/host_backup.h) */          \
  X(cuMemHostRegister_v2, "cuMemHostRegister_v2", PFN_cuMemHostRegister_v6050, false)  \
  X(cuMemHostUnregister, "cuMemHostUnregister", PFN_cuMemHostUnregister_v4000, false)  \
  X(cuMemHostGetFlags, "cuMemHostGetFlags", PFN_cuMemHostGetFlags_v2030, false)        \
  /* page-locked backups, copied on the copier's own stream (host_backup.h) */        \
  X(cuStreamCreate, "cuStreamCreate", PFN_cuStreamCreate_v2000, false)                 \
  /* the residency report (core/report/residency.h) */                                  \
  X(cuDeviceGetGraphMemAttribute, "cuDeviceGetGraphMemAttribute",                      \
    PFN_cuDeviceGetGraphMemAttribute_v11040, false)                                    \
  /* a whole process's sleep and wake from a helper (CUDA 12.8 driver API, r570; */       \
  /* docs/deep-sleep.md): called on another process's pid, never on the shim's own */    \
  X(cuCheckpointProcessGetState, "cuCheckpointProcessGetState",                        \
    PFN_cuCheckpointProcessGetState_v12080, false)                                     \
  X(cuCheckpointProcessLock, "cuCheckpointProcessLock", PFN_cuCheckpointProcessLock_v12080, \
    false)                                                                             \
  X(cuCheckpointProcessCheckpoint, "cuCheckpointProcessCheckpoint",                    \
    PFN_cuCheckpointProcessCheckpoint_v12080, false)                                   \
  X(cuCheckpointProcessRestore, "cuCheckpointProcessRestore",                          \
    PFN_cuCheckpointProcessRestore_v12080, false)                                      \
  X(cuCheckpointProcessUnlock, "cuCheckpointProcessUnlock",                            \
    PFN_cuCheckpointProcessUnlock_v12080, false)                                       \
  /* work submission: copies and event records the shim makes itself, and the */        \
  /* entry points the submission gate holds back (core/driver/work_submission.h) */     \
  VMMSHIM_WORK_SUBMISSION_ENTRY_POINTS(X)

struct DriverApi {
#define VMMSHIM_DECLARE_ENTRY(member, symbol, type, required) type member = nullptr;
  VMMSHIM_DRIVER_ENTRY_POINTS(VMMSHIM_DECLARE_ENTRY)
#undef VMMSHIM_DECLARE_ENTRY

  // Returns the symbol name of the table slot holding `fn`, or nullptr when
  // `fn` is not the address of any entry. Used to route resolver answers by
  // address identity (see interpose/).
  const char* NameOf(const void* fn) const;
};

// Signature of a symbol lookup: dlsym() on a library handle, or a test's own.
using SymbolLookup = void* (*)(void* handle, const char* symbol);

// Fills a DriverApi from `handle` with `lookup` (normally the real dlsym).
// Entries the library lacks stay nullptr.
DriverApi LoadDriverApi(void* handle, SymbolLookup lookup);

// OK when every required entry is present; otherwise kNotFound naming the
// first missing one.
absl::Status CheckRequired(const DriverApi& api);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_DRIVER_DRIVER_API_H_

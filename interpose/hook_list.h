// The one list of hooked driver exports.
//
// X(name, PFN type): `name` is the driver export whose ABI the hook
// implements (the versioned symbol: cuMemAlloc_v2, not cuMemAlloc), and the
// hook is the exported function of that name in interpose/hooks_*.cc. The
// PFN type from <cudaTypedefs.h> (as in core/driver/driver_api.h) declares the hook
// in hooks_internal.h, so a hook defined with another ABI fails to compile.
//
// Generated from this list: the routing table of HookFor
// (interpose/hooks_resolver.cc), and the cu* globals of the version script
// (CMakeLists.txt fills interpose/vmmshim.map.in with the names of the X(cu...
// entries below, so keep one entry per X). hook_list_matches_version_script
// checks the generated script against this list, and elf_exports_and_needed
// the script against `nm -D`. Adding a hook: one line here, the definition in
// the file of its family.
#ifndef VMMSHIM_INTERPOSE_HOOK_LIST_H_
#define VMMSHIM_INTERPOSE_HOOK_LIST_H_

// The #undefs of cuGetProcAddress, cuCtxDestroy, cuDevicePrimaryCtxRelease,
// cuDevicePrimaryCtxReset and cuIpcOpenMemHandle: every name below means the
// export of exactly that name.
#include "core/driver/driver_api.h"

// One entry per line (the e2e test reads the names with a regular expression).
#define VMMSHIM_HOOKED_DRIVER_EXPORTS(X)                                          \
  /* resolvers: interpose/hooks_resolver.cc */                                    \
  X(cuGetProcAddress, PFN_cuGetProcAddress_v11030)                                \
  X(cuGetProcAddress_v2, PFN_cuGetProcAddress_v12000)                             \
  /* memory: interpose/hooks_memory.cc */                                         \
  X(cuMemAlloc_v2, PFN_cuMemAlloc_v3020)                                          \
  X(cuMemAllocPitch_v2, PFN_cuMemAllocPitch_v3020)                                \
  X(cuMemFree_v2, PFN_cuMemFree_v3020)                                            \
  X(cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020)                                      \
  X(cuMemGetAddressRange_v2, PFN_cuMemGetAddressRange_v3020)                      \
  X(cuPointerGetAttribute, PFN_cuPointerGetAttribute_v4000)                       \
  X(cuPointerGetAttributes, PFN_cuPointerGetAttributes_v7000)                     \
  X(cuMemFreeAsync, PFN_cuMemFreeAsync_v11020)                                    \
  X(cuMemFreeAsync_ptsz, PFN_cuMemFreeAsync_v11020_ptsz)                          \
  /* peer access: interpose/hooks_peer.cc */                                      \
  X(cuCtxEnablePeerAccess, PFN_cuCtxEnablePeerAccess_v4000)                       \
  X(cuCtxDisablePeerAccess, PFN_cuCtxDisablePeerAccess_v4000)                     \
  /* IPC: interpose/hooks_ipc.cc */                                               \
  X(cuIpcGetMemHandle, PFN_cuIpcGetMemHandle_v4010)                               \
  X(cuIpcOpenMemHandle_v2, PFN_cuIpcOpenMemHandle_v11000)                         \
  X(cuIpcOpenMemHandle, PFN_cuIpcOpenMemHandle_v11000)                            \
  X(cuIpcCloseMemHandle, PFN_cuIpcCloseMemHandle_v4010)                           \
  /* context lifecycle: interpose/hooks_context.cc */                             \
  X(cuDevicePrimaryCtxReset_v2, PFN_cuDevicePrimaryCtxReset_v11000)               \
  X(cuDevicePrimaryCtxReset, PFN_cuDevicePrimaryCtxReset_v11000)                  \
  X(cuDevicePrimaryCtxRelease_v2, PFN_cuDevicePrimaryCtxRelease_v11000)           \
  X(cuDevicePrimaryCtxRelease, PFN_cuDevicePrimaryCtxRelease_v11000)              \
  X(cuCtxDestroy_v2, PFN_cuCtxDestroy_v4000)                                      \
  X(cuCtxDestroy, PFN_cuCtxDestroy_v4000)                                         \
  /* stream capture: interpose/hooks_capture.cc */                                \
  X(cuStreamBeginCapture_v2, PFN_cuStreamBeginCapture_v10010)                     \
  X(cuStreamBeginCapture_v2_ptsz, PFN_cuStreamBeginCapture_v10010_ptsz)           \
  X(cuStreamBeginCaptureToGraph, PFN_cuStreamBeginCaptureToGraph_v12030)          \
  X(cuStreamBeginCaptureToGraph_ptsz, PFN_cuStreamBeginCaptureToGraph_v12030_ptsz) \
  X(cuStreamEndCapture, PFN_cuStreamEndCapture_v10000)                            \
  X(cuStreamEndCapture_ptsz, PFN_cuStreamEndCapture_v10000_ptsz)                 \
  /* stream-ordered allocation: interpose/hooks_stream_ordered.cc */              \
  X(cuMemAllocAsync, PFN_cuMemAllocAsync_v11020)                                  \
  X(cuMemAllocAsync_ptsz, PFN_cuMemAllocAsync_v11020_ptsz)                        \
  X(cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020)                  \
  X(cuMemAllocFromPoolAsync_ptsz, PFN_cuMemAllocFromPoolAsync_v11020_ptsz)        \
  X(cuMemPoolSetAccess, PFN_cuMemPoolSetAccess_v11020)                            \
  X(cuMemPoolGetAttribute, PFN_cuMemPoolGetAttribute_v11020)                      \
  X(cuMemPoolSetAttribute, PFN_cuMemPoolSetAttribute_v11020)                      \
  X(cuMemPoolTrimTo, PFN_cuMemPoolTrimTo_v11020)                                  \
  X(cuDeviceSetMemPool, PFN_cuDeviceSetMemPool_v11020)                            \
  X(cuMemSetMemPool, PFN_cuMemSetMemPool_v13000)                                  \
  X(cuStreamDestroy_v2, PFN_cuStreamDestroy_v4000)                                \
  X(cuStreamSynchronize, PFN_cuStreamSynchronize_v2000)                           \
  X(cuStreamSynchronize_ptsz, PFN_cuStreamSynchronize_v7000_ptsz)                 \
  X(cuCtxSynchronize, PFN_cuCtxSynchronize_v2000)                                 \
  X(cuCtxSynchronize_v2, PFN_cuCtxSynchronize_v13000)                             \
  /* other libraries' VMM calls, recorded and paused: interpose/hooks_vmm.cc */   \
  X(cuMemCreate, PFN_cuMemCreate_v10020)                                          \
  X(cuMemRelease, PFN_cuMemRelease_v10020)                                        \
  X(cuMemRetainAllocationHandle, PFN_cuMemRetainAllocationHandle_v11000)          \
  X(cuMemMap, PFN_cuMemMap_v10020)                                                \
  X(cuMemUnmap, PFN_cuMemUnmap_v10020)                                            \
  X(cuMemSetAccess, PFN_cuMemSetAccess_v10020)                                    \
  X(cuMemGetAllocationPropertiesFromHandle,                                       \
    PFN_cuMemGetAllocationPropertiesFromHandle_v10020)                            \
  X(cuMemExportToShareableHandle, PFN_cuMemExportToShareableHandle_v10020)        \
  X(cuMemImportFromShareableHandle, PFN_cuMemImportFromShareableHandle_v10020)     \
  X(cuMemAddressReserve, PFN_cuMemAddressReserve_v10020)                          \
  X(cuMemAddressFree, PFN_cuMemAddressFree_v10020)

#endif  // VMMSHIM_INTERPOSE_HOOK_LIST_H_

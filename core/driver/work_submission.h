// The driver entry points through which a program's work reaches a stream or
// the device: every one the shim gates before a pause it does not control
// (core/sync/submission_gate.h; docs/pause-resume.md, "Quiescing").
//
// The set is the driver's own: each PFN type of <cudaTypedefs.h> whose entry
// point launches a kernel, a graph or a host function, copies, sets memory,
// waits on or writes to a stream, records or waits on an event (a stream's,
// a context's, a green context's), prefetches or discards, decompresses,
// maps a sparse array, signals or waits on an external semaphore, or
// instantiates a graph with parameters (which may upload it on a stream),
// in every ABI version and _ptsz/_ptds (per-thread default stream)
// form the driver exports with a public type (the exports of the toolkit's
// stub libcuda.so). Not here: the unsuffixed memcpy and memset exports
// (cuMemcpyHtoD, cuMemsetD8, ...), the 32-bit-pointer ABI of CUDA 2.x,
// whose types cudaTypedefs.h gives only to the driver's own build and which
// the resolver hands out only for a cudaVersion below 3020.
// tests/e2e/check_work_submission.py checks the list against the header and
// the stub: every entry point of these families and every one that takes a
// CUstream is either here or in VMMSHIM_UNGATED_STREAM_ENTRY_POINTS with the
// reason it does not submit work.
//
// VMMSHIM_SUBMITS(X, export, PFN type) expands to the driver table's entry
// form X(member, "export", type, required = false): the table
// (core/driver/driver_api.h) holds each as an optional entry point, and
// interpose/hooks_submission.cc makes each a gated hook. Like the table, an
// entry names the exported symbol whose ABI it has.
#ifndef VMMSHIM_CORE_DRIVER_WORK_SUBMISSION_H_
#define VMMSHIM_CORE_DRIVER_WORK_SUBMISSION_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

// cuda.h defines these names as macros (their _v2 or per-thread exports): in
// vmmshim every name means the export of exactly that name.
#undef cuEventRecord
#undef cuEventRecordWithFlags
#undef cuGraphInstantiateWithParams
#undef cuGraphLaunch
#undef cuGraphUpload
#undef cuLaunchCooperativeKernel
#undef cuLaunchHostFunc
#undef cuLaunchKernel
#undef cuLaunchKernelEx
#undef cuMemBatchDecompressAsync
#undef cuMemDiscardAndPrefetchBatchAsync
#undef cuMemDiscardBatchAsync
#undef cuMemMapArrayAsync
#undef cuMemPrefetchAsync
#undef cuMemPrefetchBatchAsync
#undef cuMemcpy
#undef cuMemcpy3DBatchAsync
#undef cuMemcpy3DPeer
#undef cuMemcpy3DPeerAsync
#undef cuMemcpyAsync
#undef cuMemcpyBatchAsync
#undef cuMemcpyPeer
#undef cuMemcpyPeerAsync
#undef cuMemsetD16Async
#undef cuMemsetD2D16Async
#undef cuMemsetD2D32Async
#undef cuMemsetD2D8Async
#undef cuMemsetD32Async
#undef cuMemsetD8Async
#undef cuSignalExternalSemaphoresAsync
#undef cuStreamAddCallback
#undef cuStreamBatchMemOp
#undef cuStreamWaitEvent
#undef cuStreamWaitValue32
#undef cuStreamWaitValue64
#undef cuStreamWriteValue32
#undef cuStreamWriteValue64
#undef cuWaitExternalSemaphoresAsync

#define VMMSHIM_SUBMITS(X, name, type) X(name, #name, type, false)

// One entry per line (tests/e2e/check_work_submission.py and the version
// script's generator read the names with a regular expression).
#define VMMSHIM_WORK_SUBMISSION_ENTRY_POINTS(X)                                                 \
  /* kernel and graph launches, host functions */                                                 \
  VMMSHIM_SUBMITS(X, cuGraphInstantiateWithParams, PFN_cuGraphInstantiateWithParams_v12000)     \
  VMMSHIM_SUBMITS(X, cuGraphInstantiateWithParams_ptsz,                                           \
                  PFN_cuGraphInstantiateWithParams_v12000_ptsz)                                 \
  VMMSHIM_SUBMITS(X, cuGraphLaunch, PFN_cuGraphLaunch_v10000)                                     \
  VMMSHIM_SUBMITS(X, cuGraphLaunch_ptsz, PFN_cuGraphLaunch_v10000_ptsz)                           \
  VMMSHIM_SUBMITS(X, cuGraphUpload, PFN_cuGraphUpload_v11010)                                     \
  VMMSHIM_SUBMITS(X, cuGraphUpload_ptsz, PFN_cuGraphUpload_v11010_ptsz)                           \
  VMMSHIM_SUBMITS(X, cuLaunch, PFN_cuLaunch_v2000)                                                \
  VMMSHIM_SUBMITS(X, cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000)              \
  VMMSHIM_SUBMITS(X, cuLaunchCooperativeKernelMultiDevice,                                        \
                  PFN_cuLaunchCooperativeKernelMultiDevice_v9000)                                 \
  VMMSHIM_SUBMITS(X, cuLaunchCooperativeKernel_ptsz, PFN_cuLaunchCooperativeKernel_v9000_ptsz)    \
  VMMSHIM_SUBMITS(X, cuLaunchGrid, PFN_cuLaunchGrid_v2000)                                        \
  VMMSHIM_SUBMITS(X, cuLaunchGridAsync, PFN_cuLaunchGridAsync_v2000)                              \
  VMMSHIM_SUBMITS(X, cuLaunchHostFunc, PFN_cuLaunchHostFunc_v10000)                               \
  VMMSHIM_SUBMITS(X, cuLaunchHostFunc_ptsz, PFN_cuLaunchHostFunc_v10000_ptsz)                     \
  VMMSHIM_SUBMITS(X, cuLaunchKernel, PFN_cuLaunchKernel_v4000)                                    \
  VMMSHIM_SUBMITS(X, cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060)                               \
  VMMSHIM_SUBMITS(X, cuLaunchKernelEx_ptsz, PFN_cuLaunchKernelEx_v11060_ptsz)                     \
  VMMSHIM_SUBMITS(X, cuLaunchKernel_ptsz, PFN_cuLaunchKernel_v7000_ptsz)                          \
  /* copies, synchronous and stream-ordered */                                                    \
  VMMSHIM_SUBMITS(X, cuMemcpy, PFN_cuMemcpy_v4000)                                                \
  VMMSHIM_SUBMITS(X, cuMemcpy2DAsync_v2, PFN_cuMemcpy2DAsync_v3020)                               \
  VMMSHIM_SUBMITS(X, cuMemcpy2DAsync_v2_ptsz, PFN_cuMemcpy2DAsync_v7000_ptsz)                     \
  VMMSHIM_SUBMITS(X, cuMemcpy2DUnaligned_v2, PFN_cuMemcpy2DUnaligned_v3020)                       \
  VMMSHIM_SUBMITS(X, cuMemcpy2DUnaligned_v2_ptds, PFN_cuMemcpy2DUnaligned_v7000_ptds)             \
  VMMSHIM_SUBMITS(X, cuMemcpy2D_v2, PFN_cuMemcpy2D_v3020)                                         \
  VMMSHIM_SUBMITS(X, cuMemcpy2D_v2_ptds, PFN_cuMemcpy2D_v7000_ptds)                               \
  VMMSHIM_SUBMITS(X, cuMemcpy3DAsync_v2, PFN_cuMemcpy3DAsync_v3020)                               \
  VMMSHIM_SUBMITS(X, cuMemcpy3DAsync_v2_ptsz, PFN_cuMemcpy3DAsync_v7000_ptsz)                     \
  VMMSHIM_SUBMITS(X, cuMemcpy3DBatchAsync, PFN_cuMemcpy3DBatchAsync_v12080)                       \
  VMMSHIM_SUBMITS(X, cuMemcpy3DBatchAsync_ptsz, PFN_cuMemcpy3DBatchAsync_v12080_ptsz)             \
  VMMSHIM_SUBMITS(X, cuMemcpy3DBatchAsync_v2, PFN_cuMemcpy3DBatchAsync_v13000)                    \
  VMMSHIM_SUBMITS(X, cuMemcpy3DBatchAsync_v2_ptsz, PFN_cuMemcpy3DBatchAsync_v13000_ptsz)          \
  VMMSHIM_SUBMITS(X, cuMemcpy3DPeer, PFN_cuMemcpy3DPeer_v4000)                                    \
  VMMSHIM_SUBMITS(X, cuMemcpy3DPeerAsync, PFN_cuMemcpy3DPeerAsync_v4000)                          \
  VMMSHIM_SUBMITS(X, cuMemcpy3DPeerAsync_ptsz, PFN_cuMemcpy3DPeerAsync_v7000_ptsz)                \
  VMMSHIM_SUBMITS(X, cuMemcpy3DPeer_ptds, PFN_cuMemcpy3DPeer_v7000_ptds)                          \
  VMMSHIM_SUBMITS(X, cuMemcpy3D_v2, PFN_cuMemcpy3D_v3020)                                         \
  VMMSHIM_SUBMITS(X, cuMemcpy3D_v2_ptds, PFN_cuMemcpy3D_v7000_ptds)                               \
  VMMSHIM_SUBMITS(X, cuMemcpyAsync, PFN_cuMemcpyAsync_v4000)                                      \
  VMMSHIM_SUBMITS(X, cuMemcpyAsync_ptsz, PFN_cuMemcpyAsync_v7000_ptsz)                            \
  VMMSHIM_SUBMITS(X, cuMemcpyAtoA_v2, PFN_cuMemcpyAtoA_v3020)                                     \
  VMMSHIM_SUBMITS(X, cuMemcpyAtoA_v2_ptds, PFN_cuMemcpyAtoA_v7000_ptds)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyAtoD_v2, PFN_cuMemcpyAtoD_v3020)                                     \
  VMMSHIM_SUBMITS(X, cuMemcpyAtoD_v2_ptds, PFN_cuMemcpyAtoD_v7000_ptds)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyAtoHAsync_v2, PFN_cuMemcpyAtoHAsync_v3020)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyAtoHAsync_v2_ptsz, PFN_cuMemcpyAtoHAsync_v7000_ptsz)                 \
  VMMSHIM_SUBMITS(X, cuMemcpyAtoH_v2, PFN_cuMemcpyAtoH_v3020)                                     \
  VMMSHIM_SUBMITS(X, cuMemcpyAtoH_v2_ptds, PFN_cuMemcpyAtoH_v7000_ptds)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyBatchAsync, PFN_cuMemcpyBatchAsync_v12080)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyBatchAsync_ptsz, PFN_cuMemcpyBatchAsync_v12080_ptsz)                 \
  VMMSHIM_SUBMITS(X, cuMemcpyBatchAsync_v2, PFN_cuMemcpyBatchAsync_v13000)                        \
  VMMSHIM_SUBMITS(X, cuMemcpyBatchAsync_v2_ptsz, PFN_cuMemcpyBatchAsync_v13000_ptsz)              \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoA_v2, PFN_cuMemcpyDtoA_v3020)                                     \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoA_v2_ptds, PFN_cuMemcpyDtoA_v7000_ptds)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoDAsync_v2, PFN_cuMemcpyDtoDAsync_v3020)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoDAsync_v2_ptsz, PFN_cuMemcpyDtoDAsync_v7000_ptsz)                 \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoD_v2, PFN_cuMemcpyDtoD_v3020)                                     \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoD_v2_ptds, PFN_cuMemcpyDtoD_v7000_ptds)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoHAsync_v2, PFN_cuMemcpyDtoHAsync_v3020)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoHAsync_v2_ptsz, PFN_cuMemcpyDtoHAsync_v7000_ptsz)                 \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoH_v2, PFN_cuMemcpyDtoH_v3020)                                     \
  VMMSHIM_SUBMITS(X, cuMemcpyDtoH_v2_ptds, PFN_cuMemcpyDtoH_v7000_ptds)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyHtoAAsync_v2, PFN_cuMemcpyHtoAAsync_v3020)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyHtoAAsync_v2_ptsz, PFN_cuMemcpyHtoAAsync_v7000_ptsz)                 \
  VMMSHIM_SUBMITS(X, cuMemcpyHtoA_v2, PFN_cuMemcpyHtoA_v3020)                                     \
  VMMSHIM_SUBMITS(X, cuMemcpyHtoA_v2_ptds, PFN_cuMemcpyHtoA_v7000_ptds)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyHtoDAsync_v2, PFN_cuMemcpyHtoDAsync_v3020)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyHtoDAsync_v2_ptsz, PFN_cuMemcpyHtoDAsync_v7000_ptsz)                 \
  VMMSHIM_SUBMITS(X, cuMemcpyHtoD_v2, PFN_cuMemcpyHtoD_v3020)                                     \
  VMMSHIM_SUBMITS(X, cuMemcpyHtoD_v2_ptds, PFN_cuMemcpyHtoD_v7000_ptds)                           \
  VMMSHIM_SUBMITS(X, cuMemcpyPeer, PFN_cuMemcpyPeer_v4000)                                        \
  VMMSHIM_SUBMITS(X, cuMemcpyPeerAsync, PFN_cuMemcpyPeerAsync_v4000)                              \
  VMMSHIM_SUBMITS(X, cuMemcpyPeerAsync_ptsz, PFN_cuMemcpyPeerAsync_v7000_ptsz)                    \
  VMMSHIM_SUBMITS(X, cuMemcpyPeer_ptds, PFN_cuMemcpyPeer_v7000_ptds)                              \
  VMMSHIM_SUBMITS(X, cuMemcpy_ptds, PFN_cuMemcpy_v7000_ptds)                                      \
  /* memsets, synchronous and stream-ordered */                                                   \
  VMMSHIM_SUBMITS(X, cuMemsetD16Async, PFN_cuMemsetD16Async_v3020)                                \
  VMMSHIM_SUBMITS(X, cuMemsetD16Async_ptsz, PFN_cuMemsetD16Async_v7000_ptsz)                      \
  VMMSHIM_SUBMITS(X, cuMemsetD16_v2, PFN_cuMemsetD16_v3020)                                       \
  VMMSHIM_SUBMITS(X, cuMemsetD16_v2_ptds, PFN_cuMemsetD16_v7000_ptds)                             \
  VMMSHIM_SUBMITS(X, cuMemsetD2D16Async, PFN_cuMemsetD2D16Async_v3020)                            \
  VMMSHIM_SUBMITS(X, cuMemsetD2D16Async_ptsz, PFN_cuMemsetD2D16Async_v7000_ptsz)                  \
  VMMSHIM_SUBMITS(X, cuMemsetD2D16_v2, PFN_cuMemsetD2D16_v3020)                                   \
  VMMSHIM_SUBMITS(X, cuMemsetD2D16_v2_ptds, PFN_cuMemsetD2D16_v7000_ptds)                         \
  VMMSHIM_SUBMITS(X, cuMemsetD2D32Async, PFN_cuMemsetD2D32Async_v3020)                            \
  VMMSHIM_SUBMITS(X, cuMemsetD2D32Async_ptsz, PFN_cuMemsetD2D32Async_v7000_ptsz)                  \
  VMMSHIM_SUBMITS(X, cuMemsetD2D32_v2, PFN_cuMemsetD2D32_v3020)                                   \
  VMMSHIM_SUBMITS(X, cuMemsetD2D32_v2_ptds, PFN_cuMemsetD2D32_v7000_ptds)                         \
  VMMSHIM_SUBMITS(X, cuMemsetD2D8Async, PFN_cuMemsetD2D8Async_v3020)                              \
  VMMSHIM_SUBMITS(X, cuMemsetD2D8Async_ptsz, PFN_cuMemsetD2D8Async_v7000_ptsz)                    \
  VMMSHIM_SUBMITS(X, cuMemsetD2D8_v2, PFN_cuMemsetD2D8_v3020)                                     \
  VMMSHIM_SUBMITS(X, cuMemsetD2D8_v2_ptds, PFN_cuMemsetD2D8_v7000_ptds)                           \
  VMMSHIM_SUBMITS(X, cuMemsetD32Async, PFN_cuMemsetD32Async_v3020)                                \
  VMMSHIM_SUBMITS(X, cuMemsetD32Async_ptsz, PFN_cuMemsetD32Async_v7000_ptsz)                      \
  VMMSHIM_SUBMITS(X, cuMemsetD32_v2, PFN_cuMemsetD32_v3020)                                       \
  VMMSHIM_SUBMITS(X, cuMemsetD32_v2_ptds, PFN_cuMemsetD32_v7000_ptds)                             \
  VMMSHIM_SUBMITS(X, cuMemsetD8Async, PFN_cuMemsetD8Async_v3020)                                  \
  VMMSHIM_SUBMITS(X, cuMemsetD8Async_ptsz, PFN_cuMemsetD8Async_v7000_ptsz)                        \
  VMMSHIM_SUBMITS(X, cuMemsetD8_v2, PFN_cuMemsetD8_v3020)                                         \
  VMMSHIM_SUBMITS(X, cuMemsetD8_v2_ptds, PFN_cuMemsetD8_v7000_ptds)                               \
  /* stream waits and writes, batched memory operations, stream callbacks */                      \
  VMMSHIM_SUBMITS(X, cuStreamAddCallback, PFN_cuStreamAddCallback_v5000)                          \
  VMMSHIM_SUBMITS(X, cuStreamAddCallback_ptsz, PFN_cuStreamAddCallback_v7000_ptsz)                \
  VMMSHIM_SUBMITS(X, cuStreamBatchMemOp, PFN_cuStreamBatchMemOp_v8000)                            \
  VMMSHIM_SUBMITS(X, cuStreamBatchMemOp_ptsz, PFN_cuStreamBatchMemOp_v8000_ptsz)                  \
  VMMSHIM_SUBMITS(X, cuStreamBatchMemOp_v2, PFN_cuStreamBatchMemOp_v11070)                        \
  VMMSHIM_SUBMITS(X, cuStreamBatchMemOp_v2_ptsz, PFN_cuStreamBatchMemOp_v11070_ptsz)              \
  VMMSHIM_SUBMITS(X, cuStreamWaitEvent, PFN_cuStreamWaitEvent_v3020)                              \
  VMMSHIM_SUBMITS(X, cuStreamWaitEvent_ptsz, PFN_cuStreamWaitEvent_v7000_ptsz)                    \
  VMMSHIM_SUBMITS(X, cuStreamWaitValue32, PFN_cuStreamWaitValue32_v8000)                          \
  VMMSHIM_SUBMITS(X, cuStreamWaitValue32_ptsz, PFN_cuStreamWaitValue32_v8000_ptsz)                \
  VMMSHIM_SUBMITS(X, cuStreamWaitValue32_v2, PFN_cuStreamWaitValue32_v11070)                      \
  VMMSHIM_SUBMITS(X, cuStreamWaitValue32_v2_ptsz, PFN_cuStreamWaitValue32_v11070_ptsz)            \
  VMMSHIM_SUBMITS(X, cuStreamWaitValue64, PFN_cuStreamWaitValue64_v9000)                          \
  VMMSHIM_SUBMITS(X, cuStreamWaitValue64_ptsz, PFN_cuStreamWaitValue64_v9000_ptsz)                \
  VMMSHIM_SUBMITS(X, cuStreamWaitValue64_v2, PFN_cuStreamWaitValue64_v11070)                      \
  VMMSHIM_SUBMITS(X, cuStreamWaitValue64_v2_ptsz, PFN_cuStreamWaitValue64_v11070_ptsz)            \
  VMMSHIM_SUBMITS(X, cuStreamWriteValue32, PFN_cuStreamWriteValue32_v8000)                        \
  VMMSHIM_SUBMITS(X, cuStreamWriteValue32_ptsz, PFN_cuStreamWriteValue32_v8000_ptsz)              \
  VMMSHIM_SUBMITS(X, cuStreamWriteValue32_v2, PFN_cuStreamWriteValue32_v11070)                    \
  VMMSHIM_SUBMITS(X, cuStreamWriteValue32_v2_ptsz, PFN_cuStreamWriteValue32_v11070_ptsz)          \
  VMMSHIM_SUBMITS(X, cuStreamWriteValue64, PFN_cuStreamWriteValue64_v9000)                        \
  VMMSHIM_SUBMITS(X, cuStreamWriteValue64_ptsz, PFN_cuStreamWriteValue64_v9000_ptsz)              \
  VMMSHIM_SUBMITS(X, cuStreamWriteValue64_v2, PFN_cuStreamWriteValue64_v11070)                    \
  VMMSHIM_SUBMITS(X, cuStreamWriteValue64_v2_ptsz, PFN_cuStreamWriteValue64_v11070_ptsz)          \
  /* event records */                                                                             \
  VMMSHIM_SUBMITS(X, cuCtxRecordEvent, PFN_cuCtxRecordEvent_v12050)                             \
  VMMSHIM_SUBMITS(X, cuCtxWaitEvent, PFN_cuCtxWaitEvent_v12050)                                 \
  VMMSHIM_SUBMITS(X, cuGreenCtxRecordEvent, PFN_cuGreenCtxRecordEvent_v12040)                   \
  VMMSHIM_SUBMITS(X, cuGreenCtxWaitEvent, PFN_cuGreenCtxWaitEvent_v12040)                       \
  VMMSHIM_SUBMITS(X, cuEventRecord, PFN_cuEventRecord_v2000)                                      \
  VMMSHIM_SUBMITS(X, cuEventRecordWithFlags, PFN_cuEventRecordWithFlags_v11010)                   \
  VMMSHIM_SUBMITS(X, cuEventRecordWithFlags_ptsz, PFN_cuEventRecordWithFlags_v11010_ptsz)         \
  VMMSHIM_SUBMITS(X, cuEventRecord_ptsz, PFN_cuEventRecord_v7000_ptsz)                            \
  /* prefetches, discards, decompression, sparse mappings, external semaphores */                 \
  VMMSHIM_SUBMITS(X, cuMemBatchDecompressAsync, PFN_cuMemBatchDecompressAsync_v12060)             \
  VMMSHIM_SUBMITS(X, cuMemBatchDecompressAsync_ptsz, PFN_cuMemBatchDecompressAsync_v12060_ptsz)   \
  VMMSHIM_SUBMITS(X, cuMemDiscardAndPrefetchBatchAsync,                                           \
                  PFN_cuMemDiscardAndPrefetchBatchAsync_v13000)                                   \
  VMMSHIM_SUBMITS(X, cuMemDiscardAndPrefetchBatchAsync_ptsz,                                      \
                  PFN_cuMemDiscardAndPrefetchBatchAsync_v13000_ptsz)                              \
  VMMSHIM_SUBMITS(X, cuMemDiscardBatchAsync, PFN_cuMemDiscardBatchAsync_v13000)                   \
  VMMSHIM_SUBMITS(X, cuMemDiscardBatchAsync_ptsz, PFN_cuMemDiscardBatchAsync_v13000_ptsz)         \
  VMMSHIM_SUBMITS(X, cuMemMapArrayAsync, PFN_cuMemMapArrayAsync_v11010)                           \
  VMMSHIM_SUBMITS(X, cuMemMapArrayAsync_ptsz, PFN_cuMemMapArrayAsync_v11010_ptsz)                 \
  VMMSHIM_SUBMITS(X, cuMemPrefetchAsync, PFN_cuMemPrefetchAsync_v8000)                            \
  VMMSHIM_SUBMITS(X, cuMemPrefetchAsync_ptsz, PFN_cuMemPrefetchAsync_v8000_ptsz)                  \
  VMMSHIM_SUBMITS(X, cuMemPrefetchAsync_v2, PFN_cuMemPrefetchAsync_v12020)                        \
  VMMSHIM_SUBMITS(X, cuMemPrefetchAsync_v2_ptsz, PFN_cuMemPrefetchAsync_v12020_ptsz)              \
  VMMSHIM_SUBMITS(X, cuMemPrefetchBatchAsync, PFN_cuMemPrefetchBatchAsync_v13000)                 \
  VMMSHIM_SUBMITS(X, cuMemPrefetchBatchAsync_ptsz, PFN_cuMemPrefetchBatchAsync_v13000_ptsz)       \
  VMMSHIM_SUBMITS(X, cuSignalExternalSemaphoresAsync, PFN_cuSignalExternalSemaphoresAsync_v10000) \
  VMMSHIM_SUBMITS(X, cuSignalExternalSemaphoresAsync_ptsz,                                        \
                  PFN_cuSignalExternalSemaphoresAsync_v10000_ptsz)                                \
  VMMSHIM_SUBMITS(X, cuWaitExternalSemaphoresAsync, PFN_cuWaitExternalSemaphoresAsync_v10000)     \
  VMMSHIM_SUBMITS(X, cuWaitExternalSemaphoresAsync_ptsz,                                          \
                  PFN_cuWaitExternalSemaphoresAsync_v10000_ptsz)

// Entry points that take a CUstream but submit no work that reads or writes
// device memory, so they pass while the gate is closed: X(base name, why).
// The checker above reads this table.
#define VMMSHIM_UNGATED_STREAM_ENTRY_POINTS(X)                                                    \
  X(cuMemAllocAsync, "an allocation (the shim's or the driver's pool); no device work")         \
  X(cuMemAllocFromPoolAsync, "an allocation from a pool, no device work")                        \
  X(cuMemFreeAsync, "a free: the shim's or the pool's bookkeeping, no access to the memory")     \
  X(cuStreamAttachMemAsync, "attaches managed memory to a stream; no access")                    \
  X(cuGraphicsMapResources, "graphics interop: maps a graphics resource, not shim memory")       \
  X(cuGraphicsUnmapResources, "graphics interop: unmaps a graphics resource")                    \
  X(cuGreenCtxStreamCreate, "creates a stream")                                                  \
  X(cuStreamCreate, "creates a stream")                                                          \
  X(cuStreamCreateWithPriority, "creates a stream")                                              \
  X(cuStreamDestroy, "destroys a stream; its work finishes as queued")                           \
  X(cuStreamSynchronize, "waits for work; submits none")                                         \
  X(cuStreamQuery, "asks about work; submits none")                                              \
  X(cuStreamBeginCapture, "starts recording: captured work does not run")                        \
  X(cuStreamBeginCaptureToGraph, "starts recording into a graph")                                \
  X(cuStreamEndCapture, "ends recording")                                                        \
  X(cuStreamIsCapturing, "a query")                                                              \
  X(cuStreamGetCaptureInfo, "a query")                                                           \
  X(cuStreamUpdateCaptureDependencies, "edits a capture's graph; no work runs")                  \
  X(cuThreadExchangeStreamCaptureMode, "a thread's capture mode")                                \
  X(cuStreamCopyAttributes, "stream attributes")                                                 \
  X(cuStreamGetAttribute, "a query")                                                             \
  X(cuStreamSetAttribute, "stream attributes")                                                   \
  X(cuStreamGetCtx, "a query")                                                                   \
  X(cuStreamGetDevice, "a query")                                                                \
  X(cuStreamGetFlags, "a query")                                                                 \
  X(cuStreamGetId, "a query")                                                                    \
  X(cuStreamGetPriority, "a query")                                                              \
  X(cuStreamGetGreenCtx, "a query")

namespace vmmshim {

// The gated entry points' names in list order: the submission gate names an
// entry point by its index here plus one (0: none).
#define VMMSHIM_SUBMISSION_NAME(member, symbol, type, required) symbol,
inline constexpr const char* kWorkSubmissionNames[] = {
    VMMSHIM_WORK_SUBMISSION_ENTRY_POINTS(VMMSHIM_SUBMISSION_NAME)};
#undef VMMSHIM_SUBMISSION_NAME
inline constexpr uint32_t kWorkSubmissionCount =
    sizeof kWorkSubmissionNames / sizeof kWorkSubmissionNames[0];

// The name of gate entry `entry` (index + 1), or "?".
inline const char* WorkSubmissionName(uint32_t entry) {
  return entry >= 1 && entry <= kWorkSubmissionCount ? kWorkSubmissionNames[entry - 1] : "?";
}

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_DRIVER_WORK_SUBMISSION_H_

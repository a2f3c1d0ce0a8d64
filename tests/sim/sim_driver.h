// A simulated multi-GPU CUDA driver, in host memory, for tests without a GPU.
//
// It implements the subset of the driver API that vmmshim and its test
// programs use, and enforces the Virtual Memory Management rules of the CUDA
// Programming Guide section 4.16 as strictly as the real driver or more so:
//   - cuMemCreate/cuMemMap/cuMemAddressReserve sizes and addresses are
//     multiples of the allocation granularity;
//   - cuMemMap only maps into reserved, unmapped ranges;
//   - every simulated device access (cuMemcpy*, cuMemsetD8, DeviceRead/Write)
//     checks the accessing device's rights set by cuMemSetAccess, and faults
//     with CUDA_ERROR_ILLEGAL_ADDRESS otherwise;
//   - release order: cuMemAddressFree of a range that still has mappings
//     fails (the guide's order is unmap -> release -> address free); physical
//     memory of a released handle lives until its last mapping goes.
// It counts every call per entry point and can fail the N-th call of a chosen
// entry point with a chosen CUresult (fault injection).
//
// Two builds use it: the static library `vmmshim_simcuda` (unit tests take a
// DriverApi from Api()) and `libcuda.so.1` (end-to-end preload tests), which
// exports the same functions under their driver names and configures itself
// from SIMCUDA_* variables (see OptionsFromEnv).
//
// Thread safety: all functions may be called from any thread (one mutex).
#ifndef VMMSHIM_TESTS_SIM_SIM_DRIVER_H_
#define VMMSHIM_TESTS_SIM_SIM_DRIVER_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/driver/driver_api.h"

namespace vmmshim::sim {

struct SimOptions {
  int device_count = 2;
  size_t memory_per_device = size_t{16} << 30;  // bytes
  size_t granularity = size_t{2} << 20;         // bytes, minimum == recommended
  std::vector<int> devices_without_vmm;         // ordinals
  // Device pairs (either order) without peer-to-peer capability; every other
  // pair of distinct devices can access each other.
  std::vector<std::pair<int, int>> pairs_without_p2p;
  // CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, and whether a
  // compressible cuMemCreate is granted compression.
  bool generic_compression = false;
  // cuCtxEnablePeerAccess: "Each device can support a system-wide maximum of
  // eight peer connections" (driver API reference, cuCtxEnablePeerAccess;
  // CUDA_ERROR_TOO_MANY_PEERS past it, as NVIDIA/nccl#241 shows on 10 GPUs).
  // Modelled as: a device's connections are the distinct other devices with
  // an enabled context pair in either direction; an enable that would give
  // either device more than this many fails with CUDA_ERROR_TOO_MANY_PEERS.
  int max_peer_connections = 8;
  // A freed handle's value is given to the next cuMemCreate or import, as
  // the real driver may (its handle values are not unique over time).
  bool reuse_handle_values = false;
  // cuMemCreate of host memory (CU_MEM_LOCATION_TYPE_HOST_NUMA, node 0),
  // mapped and accessed as device memory is, and by the CPU through its VA
  // once cuMemSetAccess grants the host location: every device reports
  // CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED so
  // (and HOST_NUMA_ID 0), as the H100 and H200 do; false: refused with
  // CUDA_ERROR_NOT_SUPPORTED. SIMCUDA_NO_HOST_VMM=1 turns it off.
  bool host_numa_vmm = true;
  // The host memory such handles may hold (CUDA_ERROR_OUT_OF_MEMORY past it;
  // SIMCUDA_HOST_MEMORY_MIB).
  size_t host_memory = size_t{64} << 30;
  // cuMemCreate, cuMemMap, cuMemSetAccess and cuMemHostRegister_v2 count as
  // "potentially unsafe" during a capture, as cuMemAlloc does (whether the
  // real driver counts them so is not measured): for tests that the shim's
  // own threads never invalidate a program's capture
  // (Note [The shim's own threads and captures], core/sync/capture.h).
  bool vmm_calls_unsafe_during_capture = false;
};

// Streams: any non-null CUstream value names a stream (cuStreamCreate makes
// one too). cuStreamBeginCapture_v2 / cuStreamEndCapture keep the driver's
// capture rules (modes, unsafe calls, invalidation) as measured on H200
// (core/sync/capture.h), without recording a graph; a thread whose
// cuThreadExchangeStreamCaptureMode set RELAXED makes unsafe calls freely. Stream-ordered memory:
// default and created pools, cuMemAllocAsync / cuMemFreeAsync with the
// driver's reuse rule (a block freed on a stream is reused on it at once, on
// another stream only once the work queued before the free is done), pool
// attributes, trim, access and codes as measured on H200
// (docs/stream-ordered.md). Work on a stream completes at once unless a test
// holds it.

// Work queued on `stream` from now on stays incomplete (its events are not
// ready, blocks it frees are not reusable on other streams) until
// ReleaseStream, or until something synchronizes it.
void HoldStream(CUstream stream);
void ReleaseStream(CUstream stream);

// Work: cuLaunchKernel runs a simulated kernel at once, whatever the
// function: with kernelParams {CUdeviceptr* dst, size_t* bytes, unsigned
// char* value} it writes `value` over the `bytes` at `dst`, as a device
// access of the current context's device (a fault is
// CUDA_ERROR_ILLEGAL_ADDRESS), and does nothing without them.
// cuLaunchHostFunc runs the function on a thread of the driver's, as the real
// driver does; cuCtxSynchronize and cuStreamSynchronize wait for the host
// functions running.

// The simulation's settings (docs/configuration.md, "The simulated driver"):
// SIMCUDA_DEVICES (device count, 1 to kMaxSimDevices; default 2),
// SIMCUDA_MEMORY_MIB (memory per device, MiB), SIMCUDA_COMPRESSION=1 (generic
// compression supported), SIMCUDA_NO_VMM (comma-separated ordinals),
// SIMCUDA_NO_HOST_VMM=1 (no host-located cuMemCreate), SIMCUDA_HOST_MEMORY_MIB
// (the host memory such handles may hold),
// SIMCUDA_NO_P2P (pairs without peer capability, "0-3,1-2"), SIMCUDA_FAIL
// (entry:nth:code[,...], libcuda.so.1 only). A malformed value sets *error
// (when given) to a message naming the variable and what it takes; the
// default stands in for it.
inline constexpr int kMaxSimDevices = 64;  // the shim's device limit (core/base/device_set.h)
SimOptions OptionsFromEnv(std::string* error = nullptr);

// Drops every allocation, handle, reservation, context and counter, and
// starts over with `options`. cuInit must be called again afterwards.
void Reset(const SimOptions& options);

// Fault injection: the nth call (1 = the next) of `entry` from now returns
// `code` without doing anything.
void FailCall(const std::string& entry, int nth, CUresult code);
void ClearFailures();

// Holding: from HoldCalls on, every call of `entry` (any thread) from the
// `nth` on (1 = the next) waits, before taking the driver's lock, until
// ReleaseHeldCalls. WaitForHeldCall returns once a call is waiting (false
// after `timeout_ms`). For tests that check what other threads can do while
// a driver call is in progress.
void HoldCalls(const std::string& entry, int nth = 1);
bool WaitForHeldCall(int timeout_ms);
void ReleaseHeldCalls();

uint64_t CallCount(const std::string& entry);
void ResetCallCounts();

struct Usage {
  size_t handles = 0;        // device memory handles not yet freed
  size_t handle_bytes = 0;   // their bytes
  size_t host_handles = 0;   // host memory handles (CU_MEM_LOCATION_TYPE_HOST_NUMA)
  size_t host_handle_bytes = 0;
  size_t mappings = 0;
  size_t reservations = 0;
  size_t reserved_bytes = 0;
  size_t legacy_allocations = 0;  // cuMemAlloc/cuMemAllocPitch memory
  size_t legacy_bytes = 0;
};

// Mapped VMM bytes that device `peer` may access but does not own (its
// "bytes mapped into the peer"), and the number of mappings owned by
// `device`.
size_t PeerMappedBytes(int peer);
size_t MappingsOwnedBy(int device);
Usage GetUsage();
// Bytes of device `device`'s memory in use (handles plus legacy allocations).
size_t DeviceBytesInUse(int device);
// cuMemHostRegister registrations not yet undone (by cuMemHostUnregister,
// or by the destruction or reset of the context that made them).
size_t LiveHostRegistrations();
// cuMemHostAlloc allocations not yet given back with cuMemFreeHost.
size_t LiveHostAllocations();
// CU_LIMIT_STACK_SIZE of device `device`'s primary context (cuCtxGetLimit,
// cuCtxSetLimit; the only limit simulated: others are
// CUDA_ERROR_UNSUPPORTED_LIMIT); back to the default when the primary context
// is destroyed (last release) or reset, as a new context starts with it.
inline constexpr size_t kSimDefaultStackBytes = 1024;
size_t PrimaryStackLimit(int device);
// cuCtxSynchronize calls that reached device `device`'s contexts.
uint64_t SyncCount(int device);

// Simulated kernel accesses by `device`: CUDA_SUCCESS, or
// CUDA_ERROR_ILLEGAL_ADDRESS when any byte is unmapped or not accessible.
CUresult DeviceWrite(int device, CUdeviceptr dst, const void* src, size_t bytes);
CUresult DeviceRead(int device, void* dst, CUdeviceptr src, size_t bytes);

// A DriverApi whose entries are the simulated functions.
DriverApi Api();

// The process checkpoint between processes (sim_checkpoint.cc): every
// simulated call waits here while this process is locked or checkpointed.
void WaitWhileCheckpointLocked();

// The simulated entry points, under their driver names, for the exported
// libcuda.so.1 build: X(name, (parameters), (arguments)).
#define VMMSHIM_SIM_ENTRY_POINTS(X)                                                  \
  X(cuInit, (unsigned int flags), (flags))                                           \
  X(cuDriverGetVersion, (int* version), (version))                                   \
  X(cuGetErrorName, (CUresult error, const char** str), (error, str))                \
  X(cuGetErrorString, (CUresult error, const char** str), (error, str))              \
  X(cuDeviceGet, (CUdevice * device, int ordinal), (device, ordinal))                \
  X(cuDeviceGetCount, (int* count), (count))                                         \
  X(cuDeviceGetAttribute, (int* value, CUdevice_attribute attribute, CUdevice device), \
    (value, attribute, device))                                                      \
  X(cuDeviceTotalMem_v2, (size_t * bytes, CUdevice device), (bytes, device))         \
  X(cuDeviceCanAccessPeer, (int* can, CUdevice device, CUdevice peer), (can, device, peer)) \
  X(cuCtxEnablePeerAccess, (CUcontext peer, unsigned int flags), (peer, flags))      \
  X(cuCtxDisablePeerAccess, (CUcontext peer), (peer))                                \
  X(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice device), (ctx, device))     \
  X(cuDevicePrimaryCtxRelease_v2, (CUdevice device), (device))                       \
  X(cuCtxGetCurrent, (CUcontext * ctx), (ctx))                                       \
  X(cuCtxSetCurrent, (CUcontext ctx), (ctx))                                         \
  X(cuCtxGetDevice, (CUdevice * device), (device))                                   \
  X(cuCtxPushCurrent_v2, (CUcontext ctx), (ctx))                                     \
  X(cuCtxPopCurrent_v2, (CUcontext * ctx), (ctx))                                    \
  X(cuCtxSynchronize, (void), ())                                                    \
  X(cuCtxSynchronize_v2, (CUcontext ctx), (ctx))                                     \
  X(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytes), (dptr, bytes))                \
  X(cuMemAllocPitch_v2,                                                              \
    (CUdeviceptr * dptr, size_t* pitch, size_t width, size_t height,                 \
     unsigned int element_size),                                                     \
    (dptr, pitch, width, height, element_size))                                      \
  X(cuMemFree_v2, (CUdeviceptr dptr), (dptr))                                        \
  X(cuMemGetInfo_v2, (size_t * free, size_t* total), (free, total))                  \
  X(cuMemGetAddressRange_v2, (CUdeviceptr * base, size_t* size, CUdeviceptr dptr),   \
    (base, size, dptr))                                                              \
  X(cuPointerGetAttribute, (void* data, CUpointer_attribute attribute, CUdeviceptr ptr), \
    (data, attribute, ptr))                                                          \
  X(cuPointerGetAttributes,                                                          \
    (unsigned int count, CUpointer_attribute* attributes, void** data, CUdeviceptr ptr), \
    (count, attributes, data, ptr))                                                  \
  X(cuMemGetAllocationGranularity,                                                   \
    (size_t * granularity, const CUmemAllocationProp* prop,                          \
     CUmemAllocationGranularity_flags option),                                       \
    (granularity, prop, option))                                                     \
  X(cuMemAddressReserve,                                                             \
    (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr,             \
     unsigned long long flags),                                                      \
    (ptr, size, alignment, addr, flags))                                             \
  X(cuMemAddressFree, (CUdeviceptr ptr, size_t size), (ptr, size))                   \
  X(cuMemCreate,                                                                     \
    (CUmemGenericAllocationHandle * handle, size_t size,                             \
     const CUmemAllocationProp* prop, unsigned long long flags),                     \
    (handle, size, prop, flags))                                                     \
  X(cuMemRelease, (CUmemGenericAllocationHandle handle), (handle))                   \
  X(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle * handle, void* addr), \
    (handle, addr))                                                                  \
  X(cuMemMap,                                                                        \
    (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, \
     unsigned long long flags),                                                      \
    (ptr, size, offset, handle, flags))                                              \
  X(cuMemUnmap, (CUdeviceptr ptr, size_t size), (ptr, size))                         \
  X(cuMemSetAccess,                                                                  \
    (CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count),       \
    (ptr, size, desc, count))                                                        \
  X(cuMemcpyHtoD_v2, (CUdeviceptr dst, const void* src, size_t bytes), (dst, src, bytes)) \
  X(cuMemcpyHtoD_v2_ptds, (CUdeviceptr dst, const void* src, size_t bytes),          \
    (dst, src, bytes))                                                               \
  X(cuMemcpyDtoH_v2, (void* dst, CUdeviceptr src, size_t bytes), (dst, src, bytes))  \
  X(cuMemcpyDtoHAsync_v2, (void* dst, CUdeviceptr src, size_t bytes, CUstream stream), \
    (dst, src, bytes, stream))                                                       \
  X(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void* src, size_t bytes, CUstream stream), \
    (dst, src, bytes, stream))                                                       \
  X(cuMemcpyDtoD_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes), (dst, src, bytes)) \
  X(cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream), \
    (dst, src, bytes, stream))                                                       \
  X(cuMemsetD8_v2, (CUdeviceptr dst, unsigned char value, size_t count),             \
    (dst, value, count))                                                             \
  X(cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t count, CUstream stream), \
    (dst, value, count, stream))                                                     \
  X(cuLaunchKernel,                                                                  \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
     unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void** params, \
     void** extra),                                                                  \
    (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra))                      \
  X(cuLaunchKernel_ptsz,                                                             \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
     unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void** params, \
     void** extra),                                                                  \
    (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra))                      \
  X(cuLaunchHostFunc, (CUstream stream, CUhostFn fn, void* data), (stream, fn, data)) \
  X(cuMemHostAlloc, (void** pp, size_t bytes, unsigned int flags), (pp, bytes, flags)) \
  X(cuMemFreeHost, (void* p), (p))                                                   \
  X(cuMemHostRegister_v2, (void* p, size_t bytes, unsigned int flags), (p, bytes, flags)) \
  X(cuMemHostUnregister, (void* p), (p))                                             \
  X(cuMemHostGetFlags, (unsigned int* flags, void* p), (flags, p))                   \
  X(cuMemExportToShareableHandle,                                                    \
    (void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type, \
     unsigned long long flags),                                                      \
    (shareable, handle, type, flags))                                                \
  X(cuMemImportFromShareableHandle,                                                  \
    (CUmemGenericAllocationHandle * handle, void* os_handle, CUmemAllocationHandleType type), \
    (handle, os_handle, type))                                                       \
  X(cuMemGetAllocationPropertiesFromHandle,                                          \
    (CUmemAllocationProp * prop, CUmemGenericAllocationHandle handle), (prop, handle)) \
  X(cuDevicePrimaryCtxReset_v2, (CUdevice device), (device))                         \
  X(cuDevicePrimaryCtxGetState, (CUdevice device, unsigned int* flags, int* active),  \
    (device, flags, active))                                                         \
  X(cuCtxCreate_v2, (CUcontext * ctx, unsigned int flags, CUdevice device), (ctx, flags, device)) \
  X(cuCtxDestroy_v2, (CUcontext ctx), (ctx))                                         \
  X(cuCtxGetLimit, (size_t * value, CUlimit limit), (value, limit))                  \
  X(cuCtxSetLimit, (CUlimit limit, size_t value), (limit, value))                    \
  X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream), (dptr, stream))             \
  X(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream), (dptr, stream))        \
  X(cuStreamIsCapturing, (CUstream stream, CUstreamCaptureStatus * status), (stream, status)) \
  X(cuStreamIsCapturing_ptsz, (CUstream stream, CUstreamCaptureStatus * status),     \
    (stream, status))                                                                \
  X(cuStreamBeginCapture_v2, (CUstream stream, CUstreamCaptureMode mode), (stream, mode)) \
  X(cuStreamBeginCapture_v2_ptsz, (CUstream stream, CUstreamCaptureMode mode), (stream, mode)) \
  X(cuStreamEndCapture, (CUstream stream, CUgraph * graph), (stream, graph))          \
  X(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode * mode), (mode))          \
  X(cuStreamEndCapture_ptsz, (CUstream stream, CUgraph * graph), (stream, graph))     \
  X(cuStreamSynchronize, (CUstream stream), (stream))                                \
  X(cuStreamCreate, (CUstream * stream, unsigned int flags), (stream, flags))         \
  X(cuStreamDestroy_v2, (CUstream stream), (stream))                                 \
  X(cuEventCreate, (CUevent * event, unsigned int flags), (event, flags))             \
  X(cuEventRecord, (CUevent event, CUstream stream), (event, stream))                \
  X(cuEventQuery, (CUevent event), (event))                                          \
  X(cuEventSynchronize, (CUevent event), (event))                                    \
  X(cuEventDestroy_v2, (CUevent event), (event))                                     \
  X(cuStreamWaitEvent, (CUstream stream, CUevent event, unsigned int flags),         \
    (stream, event, flags))                                                          \
  X(cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice device), (pool, device)) \
  X(cuDeviceGetMemPool, (CUmemoryPool * pool, CUdevice device), (pool, device))      \
  X(cuDeviceSetMemPool, (CUdevice device, CUmemoryPool pool), (device, pool))        \
  X(cuMemPoolCreate, (CUmemoryPool * pool, const CUmemPoolProps* props), (pool, props)) \
  X(cuMemPoolDestroy, (CUmemoryPool pool), (pool))                                   \
  X(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytes, CUstream stream),            \
    (dptr, bytes, stream))                                                           \
  X(cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytes, CUstream stream),       \
    (dptr, bytes, stream))                                                           \
  X(cuMemAllocFromPoolAsync,                                                         \
    (CUdeviceptr * dptr, size_t bytes, CUmemoryPool pool, CUstream stream),          \
    (dptr, bytes, pool, stream))                                                     \
  X(cuMemAllocFromPoolAsync_ptsz,                                                    \
    (CUdeviceptr * dptr, size_t bytes, CUmemoryPool pool, CUstream stream),          \
    (dptr, bytes, pool, stream))                                                     \
  X(cuMemSetMemPool, (CUmemLocation * location, CUmemAllocationType type, CUmemoryPool pool), \
    (location, type, pool))                                                          \
  X(cuStreamQuery, (CUstream stream), (stream))                                      \
  X(cuStreamGetCtx, (CUstream stream, CUcontext * ctx), (stream, ctx))               \
  X(cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void* value), \
    (pool, attr, value))                                                             \
  X(cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void* value), \
    (pool, attr, value))                                                             \
  X(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep), (pool, keep))                 \
  X(cuMemPoolSetAccess, (CUmemoryPool pool, const CUmemAccessDesc* map, size_t count), \
    (pool, map, count))                                                              \
  X(cuMemPoolGetAccess,                                                              \
    (CUmemAccess_flags * flags, CUmemoryPool pool, CUmemLocation* location),          \
    (flags, pool, location))                                                         \
  X(cuStreamSynchronize_ptsz, (CUstream stream), (stream))                           \
  X(cuIpcGetMemHandle, (CUipcMemHandle * handle, CUdeviceptr dptr), (handle, dptr))  \
  X(cuIpcOpenMemHandle_v2, (CUdeviceptr * dptr, CUipcMemHandle handle, unsigned int flags), \
    (dptr, handle, flags))                                                           \
  X(cuIpcCloseMemHandle, (CUdeviceptr dptr), (dptr))                                \
  X(cuCheckpointProcessGetState, (int pid, CUprocessState* state), (pid, state))     \
  X(cuCheckpointProcessLock, (int pid, CUcheckpointLockArgs* args), (pid, args))     \
  X(cuCheckpointProcessCheckpoint, (int pid, CUcheckpointCheckpointArgs* args), (pid, args)) \
  X(cuCheckpointProcessRestore, (int pid, CUcheckpointRestoreArgs* args), (pid, args)) \
  X(cuCheckpointProcessUnlock, (int pid, CUcheckpointUnlockArgs* args), (pid, args))

#define VMMSHIM_SIM_DECLARE(name, params, args) CUresult name params;
VMMSHIM_SIM_ENTRY_POINTS(VMMSHIM_SIM_DECLARE)
#undef VMMSHIM_SIM_DECLARE

// The resolver, shared by both builds: `lookup` maps a versioned symbol name
// to the function that implements it in the calling build.
using ExportLookup = void* (*)(const char* versioned_name);
CUresult GetProcAddress(const char* symbol, void** pfn, int cuda_version,
                        cuuint64_t flags, CUdriverProcAddressQueryResult* status,
                        ExportLookup lookup);

}  // namespace vmmshim::sim

#endif  // VMMSHIM_TESTS_SIM_SIM_DRIVER_H_

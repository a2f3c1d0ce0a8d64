// The VMM mapping unit: the only code in vmmshim that calls
// cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
// cuMemRelease and cuMemAddressFree (CUDA Programming Guide section 4.16,
// "Virtual Memory Management"). The allocator's heaps and the IPC importer
// both go through it, so every multi-step sequence undoes itself the same
// way on failure and the release order is the guide's: unmap -> release ->
// address free.
//
// Shapes and units: sizes and offsets are bytes; every size and address
// passed in must be a multiple of the device's allocation granularity
// (cuMemGetAllocationGranularity), which the driver checks
// (CUDA_ERROR_INVALID_VALUE otherwise).
//
// Errors: absl::Status carrying the driver's exact CUresult (core/driver/cu_status.h)
// and the name of the call that failed. A failed multi-step call leaves
// nothing behind that it created: no mapping, no reservation, no handle of
// its own.
//
// Ownership: handles returned by Create belong to the caller until passed to
// Release. A mapping holds its own reference to the physical memory, so the
// importer may release its handle right after mapping (guide 4.16.3).
//
// Thread safety: stateless apart from the driver table; any thread, any
// time. Makes no lock of its own; callers decide what they hold across
// these calls (tens of microseconds each on H200, docs/performance.md).
#ifndef VMMSHIM_CORE_DRIVER_VMM_MAPPING_H_
#define VMMSHIM_CORE_DRIVER_VMM_MAPPING_H_

#include <cuda.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"

namespace vmmshim {

class VmmMapper {
 public:
  // `driver` must outlive the mapper.
  explicit VmmMapper(const DriverApi& driver) : driver_(driver) {}

  // A new VA range of `size` bytes aligned to `alignment`.
  absl::StatusOr<CUdeviceptr> Reserve(size_t size, size_t alignment) const;
  // Gives a range from Reserve back (it must be unmapped).
  absl::Status FreeReservation(CUdeviceptr base, size_t size) const;

  // New physical memory: cuMemCreate(size, prop).
  absl::StatusOr<CUmemGenericAllocationHandle> Create(size_t size,
                                                      const CUmemAllocationProp& prop) const;
  // cuMemRelease. The driver frees the memory once no mapping uses it.
  absl::Status Release(CUmemGenericAllocationHandle handle) const;

  // The step of MapWithAccess that failed, as a value (callers count the
  // cuMemSetAccess calls made, which a failed cuMemMap did not reach).
  enum class MapStep { kNone, kMap, kSetAccess };
  // Maps `handle` from its offset 0 over [va, va + size) and grants
  // read-write access to `access` in one cuMemSetAccess. On failure nothing
  // stays mapped (the handle stays the caller's), and *failed (when given)
  // names the step; on success it is kNone.
  absl::Status MapWithAccess(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle,
                             DeviceSet access, MapStep* failed = nullptr) const;

  // One cuMemSetAccess over [va, va + size): read-write for `grant`, no
  // access for `revoke` (the sets must be disjoint; both empty: no call).
  absl::Status SetAccess(CUdeviceptr va, size_t size, DeviceSet grant, DeviceSet revoke) const;

  // cuMemUnmap of [va, va + size). On failure the range stays mapped.
  absl::Status Unmap(CUdeviceptr va, size_t size) const;

  // Host memory (cuMemCreate at CU_MEM_LOCATION_TYPE_HOST_NUMA): the CPU's
  // read-write access to [va, va + size), which must map host memory of
  // NUMA node `numa_node` (device memory: CUDA_ERROR_INVALID_VALUE).
  absl::Status GrantHostAccess(CUdeviceptr va, size_t size, int numa_node) const;

  // Virtual aliasing (guide 4.16.5.3): the first `piece` bytes of `handle`
  // mapped again and again over [va, va + size), the last time only as much
  // as is left (a multiple of the granularity), then read-write access for
  // `access` over the whole range in one cuMemSetAccess. On failure nothing
  // stays mapped.
  absl::Status MapRepeated(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle,
                           size_t piece, DeviceSet access) const;
  // Undoes MapRepeated (or one mapping: `piece` >= `size`): unmaps
  // [va + *unmapped, va + size) in one cuMemUnmap, else piece by piece,
  // advancing *unmapped past each piece unmapped, so that a retry after a
  // failure starts where this one stopped (a piece already unmapped would
  // fail again). *unmapped is 0 or a multiple of `piece` on entry; `size`
  // when everything is unmapped.
  absl::Status UnmapRepeated(CUdeviceptr va, size_t size, size_t piece, size_t* unmapped) const;

  // IPC import (guide 4.16.3): imports the POSIX file descriptor `fd`
  // (which stays the caller's), reserves `size` bytes aligned to
  // `alignment`, maps the whole handle and grants `access`. On failure
  // nothing is left: no handle, mapping or reservation.
  absl::StatusOr<CUdeviceptr> ImportAndMap(int fd, size_t size, size_t alignment,
                                           DeviceSet access) const;
  // Undoes ImportAndMap: unmap, then free the reservation.
  absl::Status UnmapAndFree(CUdeviceptr va, size_t size) const;

 private:
  const DriverApi& driver_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_DRIVER_VMM_MAPPING_H_

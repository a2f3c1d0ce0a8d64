// Host memory that a paused allocation stays addressable through
// (docs/pause-resume-design.md, "Paused memory stays addressable"): pinned
// host memory made by cuMemCreate at the device's host NUMA node
// (CU_MEM_LOCATION_TYPE_HOST_NUMA; driver API reference, cuMemCreate and
// CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), which a
// device reaches over the bus wherever it is mapped, as it reaches device
// memory, and the CPU through its own mapping.
//
// Units: bytes, multiples of the node's granularity (HostNode).
//
// Errors: the driver's CUresult in the status (core/driver/cu_status.h):
// CUDA_ERROR_NOT_SUPPORTED where the device lacks host VMM memory,
// CUDA_ERROR_OUT_OF_MEMORY when the host has no more to pin.
//
// Thread safety: a HostMappedMemory is owned by one user at a time; Query
// and Create may run on any thread (no context needed: VMM calls take none).
//
// At process exit: the owner's destructor unmaps and releases it; host
// memory of the VMM kind that a process still holds goes with the process.
#ifndef VMMSHIM_CORE_HEAP_HOST_MAPPED_MEMORY_H_
#define VMMSHIM_CORE_HEAP_HOST_MAPPED_MEMORY_H_

#include <cuda.h>

#include <cstddef>

#include "absl/status/statusor.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"
#include "core/driver/vmm_mapping.h"

namespace vmmshim {

// What a device offers for host VMM memory, read once.
struct HostNode {
  bool supported = false;  // CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  int numa_node = -1;      // CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID
  size_t granularity = 0;  // cuMemGetAllocationGranularity (minimum) at that node

  // The device's answers; unsupported when any query fails.
  static HostNode Query(const DriverApi& driver, int device);
  // cuMemCreate's properties for memory at this node.
  CUmemAllocationProp Prop() const;
};

// One cuMemCreate of host memory, mapped at a range of its own with
// read-write access for `device` (the copies between it and device memory
// run in that device's context) and for the CPU (data()). Move-only; the
// mapping, the range and the handle go at destruction.
class HostMappedMemory {
 public:
  // `bytes` > 0, a multiple of `node.granularity`.
  static absl::StatusOr<HostMappedMemory> Create(const DriverApi& driver, const HostNode& node,
                                                 int device, size_t bytes);
  HostMappedMemory() = default;
  HostMappedMemory(HostMappedMemory&& o) noexcept { *this = static_cast<HostMappedMemory&&>(o); }
  HostMappedMemory& operator=(HostMappedMemory&& o) noexcept;
  HostMappedMemory(const HostMappedMemory&) = delete;
  HostMappedMemory& operator=(const HostMappedMemory&) = delete;
  ~HostMappedMemory() { Reset(); }

  // The handle, to map the same memory elsewhere (a paused allocation's
  // address); such mappings must be gone before this object is.
  CUmemGenericAllocationHandle handle() const { return handle_; }
  // Its own range: what copies read and write.
  CUdeviceptr address() const { return address_; }
  // The same range as the CPU sees it.
  char* data() const { return reinterpret_cast<char*>(address_); }
  size_t size() const { return size_; }
  int device() const { return device_; }
  bool empty() const { return handle_ == 0; }
  // Leaves the memory to the driver with no call, empty after: a fork
  // child's copy of the parent's (whose handles mean nothing there), or
  // memory still mapped at a view that would not unmap (teardown), which
  // must never be handed out again.
  void Forget() {
    driver_ = nullptr;
    handle_ = 0;
    address_ = 0;
    size_ = 0;
  }

 private:
  void Reset();

  const DriverApi* driver_ = nullptr;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr address_ = 0;
  size_t size_ = 0;
  int device_ = -1;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_HOST_MAPPED_MEMORY_H_

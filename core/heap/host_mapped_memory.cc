#include "core/heap/host_mapped_memory.h"

#include <utility>

#include "core/driver/cu_status.h"

namespace vmmshim {

HostNode HostNode::Query(const DriverApi& driver, int device) {
  HostNode node;
  int supported = 0, numa = -1;
  if (driver.cuDeviceGetAttribute == nullptr || driver.cuMemGetAllocationGranularity == nullptr ||
      driver.cuDeviceGetAttribute(
          &supported, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) !=
          CUDA_SUCCESS ||
      driver.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device) !=
          CUDA_SUCCESS ||
      supported == 0 || numa < 0) {
    return node;
  }
  node.numa_node = numa;
  const CUmemAllocationProp prop = node.Prop();
  size_t granularity = 0;
  if (driver.cuMemGetAllocationGranularity(&granularity, &prop,
                                           CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
      granularity == 0) {
    return HostNode();
  }
  node.granularity = granularity;
  node.supported = true;
  return node;
}

CUmemAllocationProp HostNode::Prop() const {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = numa_node;
  return prop;
}

absl::StatusOr<HostMappedMemory> HostMappedMemory::Create(const DriverApi& driver,
                                                          const HostNode& node, int device,
                                                          size_t bytes) {
  if (!node.supported) {
    return DriverError(CUDA_ERROR_NOT_SUPPORTED, "cuMemCreate (host memory)");
  }
  if (bytes == 0 || bytes % node.granularity != 0) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemCreate (host memory)");
  }
  const VmmMapper mapper(driver);
  absl::StatusOr<CUmemGenericAllocationHandle> handle = mapper.Create(bytes, node.Prop());
  if (!handle.ok()) return handle.status();
  absl::StatusOr<CUdeviceptr> address = mapper.Reserve(bytes, node.granularity);
  if (!address.ok()) {
    mapper.Release(*handle).IgnoreError();
    return address.status();
  }
  absl::Status mapped = mapper.MapWithAccess(*address, bytes, *handle, DeviceSet::Of(device));
  if (mapped.ok()) {
    mapped = mapper.GrantHostAccess(*address, bytes, node.numa_node);
    if (!mapped.ok()) mapper.Unmap(*address, bytes).IgnoreError();
  }
  if (!mapped.ok()) {
    mapper.FreeReservation(*address, bytes).IgnoreError();
    mapper.Release(*handle).IgnoreError();
    return mapped;
  }
  HostMappedMemory m;
  m.driver_ = &driver;
  m.handle_ = *handle;
  m.address_ = *address;
  m.size_ = bytes;
  m.device_ = device;
  return m;
}

HostMappedMemory& HostMappedMemory::operator=(HostMappedMemory&& o) noexcept {
  if (this != &o) {
    Reset();
    driver_ = o.driver_;
    handle_ = std::exchange(o.handle_, 0);
    address_ = std::exchange(o.address_, 0);
    size_ = std::exchange(o.size_, 0);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

void HostMappedMemory::Reset() {
  if (handle_ == 0) return;
  const VmmMapper mapper(*driver_);
  // Errors here leave host memory held until the process ends; nothing
  // else can be done with them at destruction.
  if (mapper.Unmap(address_, size_).ok()) mapper.FreeReservation(address_, size_).IgnoreError();
  mapper.Release(handle_).IgnoreError();
  handle_ = 0;
  address_ = 0;
  size_ = 0;
}

}  // namespace vmmshim

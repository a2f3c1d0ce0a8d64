#include "core/driver/vmm_mapping.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/driver/cu_status.h"

namespace vmmshim {
namespace {

void AddDescriptors(DeviceSet devices, CUmemAccess_flags flags,
                    std::vector<CUmemAccessDesc>* out) {
  devices.ForEach([&](int d) {
    CUmemAccessDesc desc = {};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = d;
    desc.flags = flags;
    out->push_back(desc);
  });
}

}  // namespace

absl::StatusOr<CUdeviceptr> VmmMapper::Reserve(size_t size, size_t alignment) const {
  CUdeviceptr base = 0;
  CUresult r = driver_.cuMemAddressReserve(&base, size, alignment, 0, 0);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemAddressReserve");
  return base;
}

absl::Status VmmMapper::FreeReservation(CUdeviceptr base, size_t size) const {
  return DriverError(driver_.cuMemAddressFree(base, size), "cuMemAddressFree");
}

absl::StatusOr<CUmemGenericAllocationHandle> VmmMapper::Create(
    size_t size, const CUmemAllocationProp& prop) const {
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = driver_.cuMemCreate(&handle, size, &prop, 0);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemCreate");
  return handle;
}

absl::Status VmmMapper::Release(CUmemGenericAllocationHandle handle) const {
  return DriverError(driver_.cuMemRelease(handle), "cuMemRelease");
}

absl::Status VmmMapper::MapWithAccess(CUdeviceptr va, size_t size,
                                      CUmemGenericAllocationHandle handle,
                                      DeviceSet access, MapStep* failed) const {
  MapStep ignored;
  if (failed == nullptr) failed = &ignored;
  *failed = MapStep::kMap;
  CUresult r = driver_.cuMemMap(va, size, 0, handle, 0);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemMap");
  *failed = MapStep::kSetAccess;
  absl::Status granted = SetAccess(va, size, access, DeviceSet());
  if (!granted.ok()) {
    driver_.cuMemUnmap(va, size);
    return granted;
  }
  *failed = MapStep::kNone;
  return granted;
}

absl::Status VmmMapper::SetAccess(CUdeviceptr va, size_t size, DeviceSet grant,
                                  DeviceSet revoke) const {
  std::vector<CUmemAccessDesc> descs;
  AddDescriptors(grant, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, &descs);
  AddDescriptors(revoke - grant, CU_MEM_ACCESS_FLAGS_PROT_NONE, &descs);
  if (descs.empty()) return absl::OkStatus();
  return DriverError(driver_.cuMemSetAccess(va, size, descs.data(), descs.size()),
                     "cuMemSetAccess");
}

absl::Status VmmMapper::Unmap(CUdeviceptr va, size_t size) const {
  return DriverError(driver_.cuMemUnmap(va, size), "cuMemUnmap");
}

absl::Status VmmMapper::GrantHostAccess(CUdeviceptr va, size_t size, int numa_node) const {
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  desc.location.id = numa_node;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return DriverError(driver_.cuMemSetAccess(va, size, &desc, 1), "cuMemSetAccess (host)");
}

absl::Status VmmMapper::MapRepeated(CUdeviceptr va, size_t size,
                                    CUmemGenericAllocationHandle handle, size_t piece,
                                    DeviceSet access) const {
  size_t mapped = 0;
  absl::Status status;
  while (mapped < size && status.ok()) {
    const size_t n = std::min(piece, size - mapped);
    status = DriverError(driver_.cuMemMap(va + mapped, n, 0, handle, 0), "cuMemMap");
    if (status.ok()) mapped += n;
  }
  if (status.ok()) status = SetAccess(va, size, access, DeviceSet());
  if (!status.ok()) {
    for (size_t at = 0; at < mapped; at += piece) {
      driver_.cuMemUnmap(va + at, std::min(piece, mapped - at));
    }
  }
  return status;
}

absl::Status VmmMapper::UnmapRepeated(CUdeviceptr va, size_t size, size_t piece,
                                      size_t* unmapped) const {
  if (*unmapped >= size) return absl::OkStatus();
  absl::Status status = Unmap(va + *unmapped, size - *unmapped);
  if (status.ok() || piece == 0 || size - *unmapped <= piece) {
    if (status.ok()) *unmapped = size;
    return status;
  }
  while (*unmapped < size) {
    const size_t n = std::min(piece, size - *unmapped);
    if (status = Unmap(va + *unmapped, n); !status.ok()) return status;
    *unmapped += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<CUdeviceptr> VmmMapper::ImportAndMap(int fd, size_t size, size_t alignment,
                                                    DeviceSet access) const {
  if (driver_.cuMemImportFromShareableHandle == nullptr) {
    return DriverError(CUDA_ERROR_NOT_SUPPORTED, "cuMemImportFromShareableHandle");
  }
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = driver_.cuMemImportFromShareableHandle(
      &handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuMemImportFromShareableHandle");
  absl::StatusOr<CUdeviceptr> base = Reserve(size, alignment);
  if (!base.ok()) {
    driver_.cuMemRelease(handle);
    return base.status();
  }
  absl::Status mapped = MapWithAccess(*base, size, handle, access);
  // The mapping holds the memory from here on.
  driver_.cuMemRelease(handle);
  if (!mapped.ok()) {
    driver_.cuMemAddressFree(*base, size);
    return mapped;
  }
  return *base;
}

absl::Status VmmMapper::UnmapAndFree(CUdeviceptr va, size_t size) const {
  if (absl::Status s = Unmap(va, size); !s.ok()) return s;
  return FreeReservation(va, size);
}

}  // namespace vmmshim

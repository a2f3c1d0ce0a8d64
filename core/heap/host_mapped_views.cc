// HostMappedPool's views (core/heap/host_mapped_pool.h): paused ranges
// mapped to their host copy or to the scratch handles, and unmapped again;
// the pool's keeping of memory is in host_mapped_pool.cc.
#include <cstddef>
#include <utility>

#include "core/driver/vmm_mapping.h"
#include "core/heap/host_mapped_pool.h"

namespace vmmshim {

absl::Status HostMappedPool::MakeScratchLocked(HostMappedMemory* memory, size_t size) {
  if (!memory->empty()) return absl::OkStatus();
  absl::StatusOr<HostMappedMemory> made = HostMappedMemory::Create(driver_, node_, device_, size);
  if (!made.ok()) return made.status();
  *memory = *std::move(made);
  return absl::OkStatus();
}

absl::StatusOr<ViewMapping> HostMappedPool::MapScratch(CUdeviceptr va, size_t size,
                                                       DeviceSet access) {
  MutexLock lock(&mu_);
  const size_t granule = node_.granularity;
  const size_t large = (kLargeScratchBytes + granule - 1) / granule * granule;
  ViewMapping view{PausedView::kScratch, granule, 0, 0, 0, this};
  const VmmMapper mapper(driver_);
  // The large handle where it covers something; granules throughout where
  // it cannot be made or mapped (a host short of 64 MiB, a driver that
  // refuses it at this address).
  if (size >= large && MakeScratchLocked(&large_scratch_, large).ok() &&
      mapper.MapRepeated(va, size / large * large, large_scratch_.handle(), large, access).ok()) {
    view.head_bytes = size / large * large;
    view.head_piece = large;
  }
  if (view.head_bytes < size) {
    absl::Status s = MakeScratchLocked(&scratch_, granule);
    if (s.ok()) {
      s = mapper.MapRepeated(va + view.head_bytes, size - view.head_bytes, scratch_.handle(),
                             granule, access);
    }
    if (!s.ok()) {
      size_t unmapped = 0;
      mapper.UnmapRepeated(va, view.head_bytes, view.head_piece, &unmapped).IgnoreError();
      return s;
    }
  }
  ++scratch_views_;
  return view;
}

absl::Status ViewMapping::Unmap(const VmmMapper& mapper, CUdeviceptr va, size_t size) {
  if (!mapped()) return absl::OkStatus();
  // The head (when any) first, then the rest, each in one call where the
  // driver takes it (UnmapRepeated); `unmapped` counts from `va`.
  if (unmapped < head_bytes) {
    if (absl::Status s = mapper.UnmapRepeated(va, head_bytes, head_piece, &unmapped); !s.ok()) {
      return s;
    }
  }
  size_t tail_unmapped = unmapped - head_bytes;
  absl::Status s = mapper.UnmapRepeated(va + head_bytes, size - head_bytes, piece, &tail_unmapped);
  unmapped = head_bytes + tail_unmapped;
  if (!s.ok()) return s;
  if (scratch_of != nullptr) scratch_of->ScratchViewUnmapped();
  *this = ViewMapping();
  return absl::OkStatus();
}

absl::StatusOr<ViewMapping> HostMappedPool::MapView(CUdeviceptr va, size_t size,
                                                    const HostMappedMemory* contents,
                                                    DeviceSet access) {
  const DeviceSet owner = DeviceSet::Of(device_);
  absl::Status status;
  for (DeviceSet grant : {access | owner, owner}) {
    if (contents != nullptr) {
      status = VmmMapper(driver_).MapWithAccess(va, size, contents->handle(), grant);
      if (status.ok()) return ViewMapping{PausedView::kContents, size, 0, 0, 0, nullptr};
    } else {
      absl::StatusOr<ViewMapping> view = MapScratch(va, size, grant);
      if (view.ok()) return *view;
      status = view.status();
    }
    if (grant == owner) break;  // a peer's access was not the reason
  }
  return status;
}

void HostMappedPool::ScratchViewUnmapped() {
  MutexLock lock(&mu_);
  if (scratch_views_ > 0) --scratch_views_;
}

}  // namespace vmmshim

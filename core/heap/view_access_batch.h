// A pause's views (core/heap/host_mapped_pool.h) given their access a run
// at a time.
//
// Note [A run of views gets its access once]: a pause maps each paused
// block's host copy at the block's address and gives the devices access to
// it. Access to host memory is the dear part of a view, and part of its cost
// is per cuMemSetAccess call rather than per byte (docs/performance.md,
// "Paused memory stays addressable": bench/host_vmm_costs, run_map_each
// against run_map_span), which a pause of many small adjacent blocks pays
// hundreds of times (PyTorch's expandable segments: handles of 20 MiB side
// by side). So a pause maps each view at once and gives access over each
// run of adjacent views in one call ("the range must be fully mapped",
// cuMemSetAccess's contract: one call may span several mappings). It does
// so whenever the next block's copy is still under way (the calls then cost
// the pause nothing, the copy engine being the slower) and at its end. A
// view waiting for its access faults, as the block did between its unmap
// and its view: a pause quiesces the program's work first
// (docs/pause-resume.md).
//
// Units: bytes. Thread safety: none; one pause's commit uses it, under the
// lock that guards the views it maps.
#ifndef VMMSHIM_CORE_HEAP_VIEW_ACCESS_BATCH_H_
#define VMMSHIM_CORE_HEAP_VIEW_ACCESS_BATCH_H_

#include <cuda.h>

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "core/driver/driver_api.h"
#include "core/base/device_set.h"

namespace vmmshim {

class ViewAccessBatch {
 public:
  // `driver` must outlive the batch.
  explicit ViewAccessBatch(const DriverApi& driver) : driver_(driver) {}
  ViewAccessBatch(const ViewAccessBatch&) = delete;
  ViewAccessBatch& operator=(const ViewAccessBatch&) = delete;

  // Maps host memory `handle` whole (from offset 0) over [va, va + size),
  // its read-write access for `grant` (which holds `owner`) left to Flush.
  // cuMemMap's error, nothing mapped.
  absl::Status Map(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle,
                   DeviceSet grant, int owner);
  bool empty() const { return pending_.empty(); }

  // A range mapped by Map whose access the driver refused even for its
  // owner alone: unmapped again (or, where that failed too, left mapped
  // without access; `unmapped` says which), with the refusal.
  struct Refused {
    CUdeviceptr va = 0;
    size_t size = 0;
    bool unmapped = false;
    absl::Status status;
  };
  // Read-write access for every range mapped since the last Flush: one
  // cuMemSetAccess per run of adjacent ranges with the same grant; where
  // the driver refuses a run, range by range, and for the owner alone where
  // the grant is refused (a peer's access not being the reason, as
  // HostMappedPool::MapView does). The ranges refused even so, for the
  // caller to forget their views (and log). Empty afterwards.
  std::vector<Refused> Flush();

 private:
  struct Pending {
    CUdeviceptr va;
    size_t size;
    DeviceSet grant;
    int owner;
  };

  const DriverApi& driver_;
  std::vector<Pending> pending_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_VIEW_ACCESS_BATCH_H_

// Physical memory one heap arena could not give back: handles whose
// cuMemRelease failed (unmapped, still counted as held), mappings whose
// cuMemUnmap failed (VA, handle and peer mappings kept, never served
// again), and views of freed paused blocks whose unmap failed (VA and host
// memory kept: the host memory must not serve another pause while it is
// still mapped here). Retry gives them back when the driver lets it; Trim,
// a resume and ReleaseAll call it (core/heap/heap_arena.h).
//
// Units: bytes. Thread safety: none of its own; the arena's mutex guards it.
#ifndef VMMSHIM_CORE_HEAP_ORPHANED_MEMORY_H_
#define VMMSHIM_CORE_HEAP_ORPHANED_MEMORY_H_

#include <cuda.h>

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "core/base/device_set.h"
#include "core/driver/vmm_mapping.h"
#include "core/heap/arena_accounting.h"
#include "core/heap/host_backup.h"
#include "core/heap/host_mapped_pool.h"
#include "core/heap/va_free_list.h"

namespace vmmshim {

class OrphanedMemory {
 public:
  // An unmapped handle of `size` bytes, still counted in the figures.
  void AddHandle(CUmemGenericAllocationHandle handle, size_t size) {
    handles_.push_back({handle, size});
  }
  // A mapping of `size` bytes at `base`, also mapped into `peers`, still
  // counted; its VA stays out of the free list until it is unmapped.
  void AddMapping(CUdeviceptr base, size_t size, CUmemGenericAllocationHandle handle,
                  DeviceSet peers) {
    mappings_.push_back({base, size, handle, peers});
  }
  // The view of a freed paused block (Block::view) over [base, base +
  // size), and the `backup` whose host memory it may map, kept until it is
  // unmapped.
  void AddView(CUdeviceptr base, size_t size, ViewMapping view,
               std::optional<HostBackup> backup) {
    views_.push_back({base, size, view, std::move(backup)});
  }
  // Unmaps each mapping (its VA back to `va`, its peers' figures down; its
  // handle joins the handles), releases each handle (the figures down) and
  // unmaps each view (its VA back to `va`, its backup dropped). What still
  // fails stays for the next retry.
  void Retry(const VmmMapper& mapper, VaFreeList& va, ArenaAccounting& accounting);
  // Teardown, after a last Retry: the views still mapped keep their host
  // memory forever (HostBackup::Abandon), so that it outlives nothing it
  // came from; their VA stays out of `va`.
  void AbandonViews() {
    for (View& v : views_) {
      if (v.backup) v.backup->Abandon();
    }
  }
  // Device memory held: handles and mappings (a view holds host memory).
  size_t bytes() const;
  bool empty() const { return handles_.empty() && mappings_.empty() && views_.empty(); }

 private:
  struct Mapping {
    CUdeviceptr base;
    size_t size;
    CUmemGenericAllocationHandle handle;
    DeviceSet peers;
  };
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> handles_;
  std::vector<Mapping> mappings_;
  struct View {
    CUdeviceptr base;
    size_t size;
    ViewMapping view;
    std::optional<HostBackup> backup;
  };
  std::vector<View> views_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_ORPHANED_MEMORY_H_

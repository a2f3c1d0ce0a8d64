// The control surface of the shim's memory: the calls that ask about it
// (statistics, residency, segments, idle bytes, the host copy of paused
// contents) and steer it (trim, the memory margin, export for IPC), apart
// from allocation (core/allocator.h), as tcmalloc keeps its extension
// interface apart from malloc. ShimCore (core/shim_core.h) builds it over
// the same rooms as the Allocator; pause and sleep have rooms of their own
// (core/heap/pause.h, core/sleep/sleep_coordinator.h).
//
// Errors: absl::Status carrying the exact CUresult (core/driver/cu_status.h);
// a pointer outside the shim's VA gets NotShimMemory().
//
// Thread safety: every method, from any thread, concurrently with
// allocations and frees. The queries take each arena's lock in turn: a
// consistent view per arena, not across them.
#ifndef VMMSHIM_CORE_MEMORY_CONTROL_H_
#define VMMSHIM_CORE_MEMORY_CONTROL_H_

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/allocator.h"
#include "core/allocator_stats.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"
#include "core/foreign/foreign_vmm.h"
#include "core/heap/export_registry.h"
#include "core/heap/host_mapped_pool.h"
#include "core/heap/heap_table.h"
#include "core/heap/pause.h"
#include "core/heap/pinned_pool.h"
#include "core/heap/types.h"
#include "core/peer/enable/peer_enable.h"
#include "core/peer/policy/peer_policy.h"
#include "core/stream_ordered/stream_ordered_front_end.h"
#include "core/sync/capture.h"
#include "core/sync/context_sync.h"

namespace vmmshim {

// An allocation made shareable by Export.
struct ExportedAllocation {
  ExportToken token{};       // 128 random bits naming this export
  uint64_t offset = 0;       // of the allocation inside its physical handle
  uint64_t size = 0;         // the allocation's requested bytes
  uint64_t handle_size = 0;  // the physical handle's bytes (what an importer maps)
  int device = -1;
};

class MemoryControl {
 public:
  // The rooms it reads and steers; everything referenced must outlive it
  // (ShimCore owns it all). `memory_margin_bytes` is the Allocator's.
  struct Rooms {
    const DriverApi& driver;
    const AllocatorOptions& options;
    HeapTable& heaps;
    CaptureTracker& captures;
    const SyncCombiner& free_syncs;
    StreamOrderedFrontEnd& stream_ordered;
    const PauseCoordinator& pause;
    const ForeignVmm& foreign;
    const CallCounters& counters;
    const PeerEnableFigures& peer_enables;
    std::atomic<uint64_t>& memory_margin_bytes;
  };
  explicit MemoryControl(Rooms rooms) : r_(rooms) {}
  MemoryControl(const MemoryControl&) = delete;
  MemoryControl& operator=(const MemoryControl&) = delete;

  // ---- Asking ----
  // Every figure of the shim's memory, summed and per device.
  AllocatorStats GetStats() const;

  // What the shim holds on every device it served now, by tag and kind
  // (core/heap/types.h: DeviceResidency), with the stream-ordered cache's
  // part, the live passed-through allocations and other libraries' VMM
  // memory; device order.
  std::vector<DeviceResidency> Residency() const;

  // Every block the heaps hold (mapped, cached or paused), each with its
  // live allocations and free space in address order; device order, then
  // address order within each arena. The stream-ordered cache's blocks are
  // live allocations here (the program freed them; they wait for their
  // stream).
  std::vector<SegmentInfo> Segments() const;

  // Bytes the shim holds mapped on `device` that serve no allocation (its
  // cache); these count as free memory.
  size_t IdleBytes(int device) const;

  // The host copy of [ptr, ptr + bytes) of a paused allocation whose
  // contents were kept (HeapArena::PausedContents states the rule): valid
  // until the allocation is resumed or freed. CUDA_ERROR_INVALID_VALUE: not
  // shim memory or past the allocation's end; CUDA_ERROR_NOT_FOUND: not
  // paused, or paused without its contents.
  absl::StatusOr<const void*> PausedContents(CUdeviceptr ptr, size_t bytes) const;

  // The pinned pool now, without waiting for a fill under way (a report: 0
  // while the pool is being made).
  PinnedPool::Stats PinnedPoolNow() const { return r_.pause.pinned_pool_stats_now(); }
  // The host memory paused memory stays addressable through, per device
  // that has made any (core/heap/host_mapped_pool.h).
  std::vector<std::pair<int, HostMappedPool::Stats>> HostMemoryForPauses() const {
    std::vector<std::pair<int, HostMappedPool::Stats>> out;
    for (HostMappedPool* pool : r_.pause.host_pools()) out.emplace_back(pool->device(), pool->stats());
    return out;
  }
  const PeerPolicy& peer_policy() const { return r_.options.peer_policy; }

  // ---- Steering ----
  // Releases the cache of `device` (-1: every device) to the driver, and
  // completes frees deferred by captures that have ended; returns the bytes
  // released. Allocation also does this by itself, once, before reporting
  // CUDA_ERROR_OUT_OF_MEMORY.
  size_t Trim(int device = -1);

  // The memory margin (torch_memory_saver's memory_margin_bytes): from now
  // on a tagged allocation that needs new physical memory fails with
  // CUDA_ERROR_OUT_OF_MEMORY when, after it, less than `bytes` of the
  // device's memory would stay free (cuMemGetInfo). 0 (the default) turns
  // it off. Allocations served from the cache, and untagged ones, are not
  // checked: they are outside what the margin protects, and the cached
  // path makes no driver call.
  void SetMemoryMarginBytes(uint64_t bytes) {
    r_.memory_margin_bytes.store(bytes, std::memory_order_relaxed);
  }

  // ---- Sharing with other processes (core/ipc/ipc.h) ----
  // Makes the live allocation containing `ptr` shareable with other
  // processes: returns a token that ExportFd accepts until the allocation is
  // freed. Exporting the same allocation again returns the same token.
  // Exported memory is never cached for reuse, and a packed granule holding
  // an exported allocation takes no new allocations. The importer can map
  // the whole physical handle, which for a packed allocation is its granule.
  // Errors: CUDA_ERROR_INVALID_VALUE when `ptr` is not in a live shim
  // allocation, or its memory was created without the POSIX-fd handle type.
  absl::StatusOr<ExportedAllocation> Export(CUdeviceptr ptr);

  // A new POSIX file descriptor for the physical handle behind the export
  // named by `token`, when `offset` and `size` match it (the caller owns and
  // closes the descriptor); *handle_size is set to the handle's bytes.
  // CUDA_ERROR_INVALID_VALUE when no live export has this token or
  // offset/size differ; otherwise the driver's cuMemExportToShareableHandle
  // error.
  absl::StatusOr<int> ExportFd(const ExportToken& token, uint64_t offset, uint64_t size,
                               uint64_t* handle_size);

  // The devices that should access `bytes` of memory used on `device` that
  // the shim maps but did not allocate (IPC imports): `device` itself and
  // the peers that enabled access to it and that the policy allows for an
  // untagged allocation of this size.
  DeviceSet AccessTargets(int device, size_t bytes);

 private:
  Rooms r_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_MEMORY_CONTROL_H_

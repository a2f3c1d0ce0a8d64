#include "core/memory_control.h"

#include <map>
#include <utility>

#include "core/driver/cu_status.h"

namespace vmmshim {

AllocatorStats MemoryControl::GetStats() const {
  AllocatorStats s;
  DeviceStats total;
  r_.heaps.ForEach([&](DeviceHeap* heap) {
    s.devices.push_back(heap->stats());
    s.devices.back().stream_ordered = r_.stream_ordered.figures(heap->device());
    total += s.devices.back();
  });
  s.served_allocations = total.allocations;
  s.served_bytes = total.bytes;
  s.frees = total.frees;
  s.live_allocations = total.live_allocations;
  s.live_bytes = total.live_bytes;
  s.handles = total.handles;
  s.handle_bytes = total.handle_bytes;
  s.deferred_frees = total.deferred_frees;
  s.stream_ordered_allocations = total.stream_ordered.allocations;
  s.stream_ordered_reuses = total.stream_ordered.reuses;
  s.stream_ordered_cached_bytes = total.stream_ordered.cached;
  // Peaks of the sums, which only the process-wide counters know.
  const GlobalCounters& global = r_.heaps.global();
  s.peak_handle_bytes = global.peak.load(std::memory_order_relaxed);
  s.paused_bytes = global.paused.load(std::memory_order_relaxed);
  s.peak_paused_bytes = global.paused_peak.load(std::memory_order_relaxed);
  s.free_synchronizes = r_.free_syncs.synchronizes();
  s.free_synchronizes_shared = r_.free_syncs.shared();
  r_.counters.AddTo(&s);
  s.peer_enable_calls = r_.peer_enables.calls.load(std::memory_order_relaxed);
  s.peer_enable_seconds = r_.peer_enables.nanoseconds.load(std::memory_order_relaxed) * 1e-9;
  return s;
}

std::vector<DeviceResidency> MemoryControl::Residency() const {
  // Devices the shim served, and those where other libraries hold memory.
  std::map<int, DeviceResidency> by_device;
  r_.heaps.ForEach([&](DeviceHeap* heap) {
    DeviceResidency& r = by_device[heap->device()];
    r.device = heap->device();
    heap->ForEachArena([&](HeapArena* arena) { arena->AddResidency(&r); });
    r.stream_ordered_cached_bytes = r_.stream_ordered.figures(r.device).cached;
    r.passed_through_bytes = r_.counters.PassedThroughLive(r.device);
  });
  for (ForeignDeviceFigures& f : r_.foreign.Figures()) {
    DeviceResidency& r = by_device[f.device];
    r.device = f.device;
    r.other_vmm_by_tag = std::move(f.by_tag);
    r.other_vmm_paused_by_tag = std::move(f.paused_by_tag);
    r.other_vmm_paused_faulting_bytes = f.paused_faulting_bytes;
    r.other_vmm_exported_bytes = f.exported_bytes;
    r.other_vmm_unmapped_bytes = f.unmapped_bytes;
    r.other_vmm_imported_bytes = f.imported_bytes;
  }
  std::vector<DeviceResidency> out;
  for (auto& [device, r] : by_device) out.push_back(std::move(r));
  return out;
}

std::vector<SegmentInfo> MemoryControl::Segments() const {
  std::vector<SegmentInfo> out;
  r_.heaps.ForEach([&](DeviceHeap* heap) {
    heap->ForEachArena([&](HeapArena* arena) { arena->AddSegments(&out); });
  });
  return out;
}

size_t MemoryControl::IdleBytes(int device) const {
  DeviceHeap* heap = r_.heaps.heap(device);
  return heap == nullptr ? 0 : heap->cached_bytes();
}

absl::StatusOr<const void*> MemoryControl::PausedContents(CUdeviceptr ptr, size_t bytes) const {
  HeapArena* arena = r_.heaps.Locate(ptr).arena;
  if (arena == nullptr) return NotShimMemory();
  return arena->PausedContents(ptr, bytes);
}

size_t MemoryControl::Trim(int device) {
  r_.heaps.ReclaimDeferred(r_.captures);
  r_.stream_ordered.Reclaim(device);
  size_t released = 0;
  r_.heaps.ForEach([&](DeviceHeap* heap) {
    if (device < 0 || heap->device() == device) released += heap->Trim();
  });
  return released;
}

absl::StatusOr<ExportedAllocation> MemoryControl::Export(CUdeviceptr ptr) {
  HeapArena* arena = r_.heaps.Locate(ptr).arena;
  if (arena == nullptr) return NotShimMemory();
  absl::StatusOr<std::pair<PointerInfo, ExportToken>> exported = arena->Export(ptr);
  if (!exported.ok()) return exported.status();
  const PointerInfo& info = exported->first;
  ExportedAllocation out;
  out.token = exported->second;
  out.offset = info.allocation_base - info.range_base;
  out.size = info.allocation_size;
  out.handle_size = info.range_size;
  out.device = info.device;
  return out;
}

absl::StatusOr<int> MemoryControl::ExportFd(const ExportToken& token, uint64_t offset,
                                        uint64_t size, uint64_t* handle_size) {
  std::optional<std::pair<int, CUdeviceptr>> where = r_.heaps.exports().Lookup(token);
  HeapArena* arena = where ? r_.heaps.Locate(where->second).arena : nullptr;
  if (arena == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle");
  return arena->ExportFd(token, where->second, offset, size, handle_size);
}

DeviceSet MemoryControl::AccessTargets(int device, size_t bytes) {
  const DeviceSet self = DeviceSet::Of(device);
  absl::StatusOr<int> count = r_.heaps.DeviceCount();
  if (!count.ok() || !DeviceSet::IsOrdinal(device)) return self;
  return (r_.options.peer_policy.Allowed(device, *count, bytes, "") &
          r_.heaps.peers().Enabled(device)) |
         self;
}

}  // namespace vmmshim

#include "core/heap/device_heap.h"

#include <algorithm>
#include <array>

#include "core/driver/cu_status.h"
#include "core/sync/thread_slot.h"

namespace vmmshim {

bool DeviceHeap::ArenaIdle(int arena) const {
  const int n = static_cast<int>(arenas_.size());
  for (int s = arena; s < kThreadSlots; s += n) {
    if (ThreadSlotHeld(s)) return false;
  }
  return true;
}

DeviceHeap::DeviceHeap(const DriverApi& driver, const VmmMapper& mapper,
                       const PeerPolicy& policy, const PeerEnableTable& peers,
                       const PeerEnableTable& pool_peers, ExportRegistry& exports,
                       ReservationMap& ranges, GlobalCounters& global, Options options)
    : device_(options.device),
      granularity_(options.granularity),
      packing_threshold_(options.packing_threshold) {
  const int n = std::max(1, options.arenas);
  for (int i = 0; i < n; ++i) {
    HeapArena::Options o = options;
    o.arena = i;
    arenas_.push_back(std::make_unique<HeapArena>(driver, mapper, policy, peers, pool_peers,
                                                  exports, ranges, global, shared_, o));
  }
}

HeapArena* DeviceHeap::Own() const {
  return arenas_.size() == 1 ? arenas_[0].get() : arenas_[ThreadSlot() % arenas_.size()].get();
}

std::optional<CUdeviceptr> DeviceHeap::AllocateFast(const Placement& placement, size_t bytes,
                                                    uint16_t origin) {
  HeapArena* own = Own();
  if (std::optional<CUdeviceptr> hit = own->AllocateFast(placement, bytes, false, origin)) {
    return hit;
  }
  // Cached memory of arenas no live thread works in (their threads
  // exited): taking it disturbs nobody. Arenas in use are left alone: a
  // thread reaching into them on every miss made their owners wait (seen on
  // the H200: medians of 11 us per free at eight threads); their cache
  // comes back through the limit, Trim and the out-of-memory retry.
  for (size_t i = 0; i < arenas_.size(); ++i) {
    HeapArena* arena = arenas_[i].get();
    if (arena == own || arena->cached_bytes_hint() == 0 || !ArenaIdle(static_cast<int>(i))) {
      continue;
    }
    if (std::optional<CUdeviceptr> hit = arena->AllocateFast(placement, bytes, true, origin)) {
      return hit;
    }
  }
  return std::nullopt;
}

absl::StatusOr<CUdeviceptr> DeviceHeap::AllocateSlow(const Placement& placement, size_t bytes,
                                                     uint16_t origin) {
  HeapArena* own = Own();
  absl::StatusOr<CUdeviceptr> ptr = own->AllocateSlow(placement, bytes, origin);
  if (ptr.ok() || ToCuResult(ptr.status()) != CUDA_ERROR_OUT_OF_MEMORY) return ptr;
  // The arena released its own cache already; the others' is free memory
  // to the application too.
  size_t released = 0;
  for (const auto& arena : arenas_) {
    if (arena.get() != own) released += arena->Trim();
  }
  return released > 0 ? own->AllocateSlow(placement, bytes, origin) : ptr;
}

std::vector<CUcontext> DeviceHeap::DeferredContexts() const {
  std::vector<CUcontext> out;
  for (const auto& arena : arenas_) {
    for (CUcontext c : arena->DeferredContexts()) {
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
  }
  return out;
}

void DeviceHeap::CompleteDeferred(CUcontext context) {
  for (const auto& arena : arenas_) arena->CompleteDeferred(context);
}

size_t DeviceHeap::Trim() {
  size_t released = 0;
  for (const auto& arena : arenas_) released += arena->Trim();
  return released;
}

bool DeviceHeap::Holds(CUcontext context) const {
  return std::any_of(arenas_.begin(), arenas_.end(),
                     [&](const auto& arena) { return arena->Holds(context); });
}

size_t DeviceHeap::ReleaseContext(CUcontext context) {
  size_t released = 0;
  bool any = false;
  for (const auto& arena : arenas_) {
    if (!arena->Holds(context)) continue;
    any = true;
    released += arena->ReleaseContext(context);
  }
  if (any) context_releases_.fetch_add(1, std::memory_order_relaxed);
  return released;
}

absl::Status DeviceHeap::ApplyPeerChange(int peer, bool stream_ordered) {
  absl::Status first;
  for (const auto& arena : arenas_) first.Update(arena->ApplyPeerChange(peer, stream_ordered));
  return first;
}

DeviceStats DeviceHeap::stats() const {
  DeviceStats out;
  out.device = device_;
  for (const auto& arena : arenas_) out += arena->stats();
  out.context_releases = context_releases_.load(std::memory_order_relaxed);
  out.peak_live_bytes = shared_.peak_live_bytes.load(std::memory_order_relaxed);
  out.peak_handle_bytes = shared_.peak_handle_bytes.load(std::memory_order_relaxed);
  out.peak_paused_bytes = shared_.peak_paused_bytes.load(std::memory_order_relaxed);
  for (int d = 0; d < kMaxDevices; ++d) {
    out.peers[d].peak_mapped_bytes = shared_.peak_mapped_bytes[d].load(std::memory_order_relaxed);
  }
  return out;
}

absl::Status DeviceHeap::ReleaseAll() {
  absl::Status first;
  for (const auto& arena : arenas_) first.Update(arena->ReleaseAll());
  return first;
}

void DeviceHeap::PrepareFork() {
  for (const auto& arena : arenas_) arena->PrepareFork();
}

void DeviceHeap::AfterForkParent() {
  for (auto it = arenas_.rbegin(); it != arenas_.rend(); ++it) (*it)->AfterForkParent();
}

void DeviceHeap::AfterForkChild() {
  for (const auto& arena : arenas_) arena->AfterForkChild();
}

}  // namespace vmmshim

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
    : ranges_(ranges),
      device_(options.device),
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

HeapArena* DeviceHeap::ArenaOf(CUdeviceptr ptr) const {
  const ReservationMap::Owner owner = ranges_.Lookup(ptr);
  if (owner.device != device_ || owner.arena < 0 ||
      owner.arena >= static_cast<int>(arenas_.size())) {
    return nullptr;
  }
  return arenas_[owner.arena].get();
}

std::optional<CUdeviceptr> DeviceHeap::AllocateFast(const Placement& placement, size_t bytes) {
  HeapArena* own = Own();
  if (std::optional<CUdeviceptr> hit = own->AllocateFast(placement, bytes)) return hit;
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
    if (std::optional<CUdeviceptr> hit = arena->AllocateFast(placement, bytes, true)) return hit;
  }
  return std::nullopt;
}

absl::StatusOr<CUdeviceptr> DeviceHeap::AllocateSlow(const Placement& placement, size_t bytes) {
  HeapArena* own = Own();
  absl::StatusOr<CUdeviceptr> ptr = own->AllocateSlow(placement, bytes);
  if (ptr.ok() || ToCuResult(ptr.status()) != CUDA_ERROR_OUT_OF_MEMORY) return ptr;
  // The arena released its own cache already; the others' is free memory
  // to the application too.
  size_t released = 0;
  for (const auto& arena : arenas_) {
    if (arena.get() != own) released += arena->Trim();
  }
  return released > 0 ? own->AllocateSlow(placement, bytes) : ptr;
}

std::optional<PointerInfo> DeviceHeap::Find(CUdeviceptr ptr) const {
  HeapArena* arena = ArenaOf(ptr);
  if (arena == nullptr) return std::nullopt;
  return arena->Find(ptr);
}

absl::Status DeviceHeap::Free(CUdeviceptr ptr, bool driver_gone) {
  HeapArena* arena = ArenaOf(ptr);
  if (arena == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFree");
  return arena->Free(ptr, driver_gone);
}

absl::Status DeviceHeap::FreeStreamOrdered(CUdeviceptr ptr, CUcontext context) {
  HeapArena* arena = ArenaOf(ptr);
  if (arena == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "stream-ordered release");
  return arena->FreeStreamOrdered(ptr, context);
}

bool DeviceHeap::Resize(CUdeviceptr ptr, size_t bytes) {
  HeapArena* arena = ArenaOf(ptr);
  return arena != nullptr && arena->Resize(ptr, bytes);
}

absl::Status DeviceHeap::DeferFree(CUdeviceptr ptr) {
  HeapArena* arena = ArenaOf(ptr);
  if (arena == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFree");
  return arena->DeferFree(ptr);
}

absl::Status DeviceHeap::SetExplicit(CUdeviceptr ptr, int peer, bool grant) {
  HeapArena* arena = ArenaOf(ptr);
  if (arena == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  return arena->SetExplicit(ptr, peer, grant);
}

absl::StatusOr<bool> DeviceHeap::PeerHasAccess(CUdeviceptr ptr, int peer) const {
  HeapArena* arena = ArenaOf(ptr);
  if (arena == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "vmmshim peer access");
  return arena->PeerHasAccess(ptr, peer);
}

absl::StatusOr<std::pair<PointerInfo, ExportToken>> DeviceHeap::Export(CUdeviceptr ptr) {
  HeapArena* arena = ArenaOf(ptr);
  if (arena == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcGetMemHandle");
  return arena->Export(ptr);
}

absl::StatusOr<int> DeviceHeap::ExportFd(const ExportToken& token, CUdeviceptr base,
                                         uint64_t offset, uint64_t size,
                                         uint64_t* handle_size) {
  HeapArena* arena = ArenaOf(base);
  if (arena == nullptr) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuIpcOpenMemHandle");
  return arena->ExportFd(token, base, offset, size, handle_size);
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
  for (const auto& arena : arenas_) {
    const DeviceStats a = arena->stats();
    out.allocations += a.allocations;
    out.bytes += a.bytes;
    out.frees += a.frees;
    out.live_allocations += a.live_allocations;
    out.live_bytes += a.live_bytes;
    out.handles += a.handles;
    out.handle_bytes += a.handle_bytes;
    out.set_access_calls += a.set_access_calls;
    out.cache_hits += a.cache_hits;
    out.cache_misses += a.cache_misses;
    out.cached_bytes += a.cached_bytes;
    out.deferred_frees += a.deferred_frees;
    out.exports += a.exports;
    out.paused_bytes += a.paused_bytes;
    out.paused_blocks += a.paused_blocks;
    // kOff < kUnsupported < kGranted < kNotGranted: an arena refused
    // compression is what the device reports.
    out.compression = std::max(out.compression, a.compression);
    for (int d = 0; d < kMaxDevices; ++d) {
      out.peers[d].grants += a.peers[d].grants;
      out.peers[d].denials += a.peers[d].denials;
      out.peers[d].mapped_bytes += a.peers[d].mapped_bytes;
    }
  }
  out.context_releases = context_releases_.load(std::memory_order_relaxed);
  out.peak_live_bytes = shared_.peak_live_bytes.load(std::memory_order_relaxed);
  out.peak_handle_bytes = shared_.peak_handle_bytes.load(std::memory_order_relaxed);
  out.peak_paused_bytes = shared_.peak_paused_bytes.load(std::memory_order_relaxed);
  for (int d = 0; d < kMaxDevices; ++d) {
    out.peers[d].peak_mapped_bytes = shared_.peak_mapped_bytes[d].load(std::memory_order_relaxed);
  }
  return out;
}

size_t DeviceHeap::PauseCandidates(const std::optional<std::string>& tag,
                                   std::vector<CUcontext>* contexts) const {
  size_t bytes = 0;
  for (const auto& arena : arenas_) bytes += arena->PauseCandidates(tag, contexts);
  return bytes;
}

absl::Status DeviceHeap::CheckPausable(const std::optional<std::string>& tag) const {
  for (const auto& arena : arenas_) {
    if (absl::Status s = arena->CheckPausable(tag); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> DeviceHeap::PausePrepare(const std::optional<std::string>& tag,
                                                BackupCopier* copier) {
  size_t bytes = 0;
  for (const auto& arena : arenas_) {
    absl::StatusOr<size_t> r = arena->PausePrepare(tag, copier);
    if (!r.ok()) {
      PauseAbort(tag);
      return r.status();
    }
    bytes += *r;
  }
  return bytes;
}

void DeviceHeap::PauseAbort(const std::optional<std::string>& tag) {
  for (const auto& arena : arenas_) arena->PauseAbort(tag);
}

absl::StatusOr<size_t> DeviceHeap::PauseCommit(const std::optional<std::string>& tag) {
  return SumOverAll(arenas_, [&](const auto& arena) { return arena->PauseCommit(tag); });
}

absl::StatusOr<size_t> DeviceHeap::ResumePrepare(const std::optional<std::string>& tag,
                                                 BackupCopier& copier) {
  size_t mapped = 0;
  for (const auto& arena : arenas_) {
    absl::StatusOr<size_t> r = arena->ResumePrepare(tag, copier);
    if (!r.ok()) {
      for (const auto& a : arenas_) a->ResumeAbort(tag);
      return r.status();
    }
    mapped += *r;
  }
  return mapped;
}

void DeviceHeap::ResumeCommit(const std::optional<std::string>& tag) {
  for (const auto& arena : arenas_) arena->ResumeCommit(tag);
}

void DeviceHeap::ResumeAbort(const std::optional<std::string>& tag) {
  for (const auto& arena : arenas_) arena->ResumeAbort(tag);
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

// HeapArena (core/heap/heap_arena.h): its figures and the counters it shares
// with the device and the process (one place each changes).
#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/driver/cu_status.h"
#include "core/heap/heap_arena.h"

namespace vmmshim {

void HeapArena::AccountHandle(int64_t delta) {
  if (delta > 0) {
    ++stats_.handles;
  } else {
    --stats_.handles;
  }
  stats_.handle_bytes += delta;
  AddWithPeak(shared_.handle_bytes, shared_.peak_handle_bytes, delta);
  AddWithPeak(global_.bytes, global_.peak, delta);
}

void HeapArena::AddPausedLocked(int64_t delta) {
  stats_.paused_bytes += delta;
  AddWithPeak(shared_.paused_bytes, shared_.peak_paused_bytes, delta);
  AddWithPeak(global_.paused, global_.paused_peak, delta);
}

void HeapArena::AddLiveLocked(int64_t delta) {
  stats_.live_bytes += delta;
  AddWithPeak(shared_.live_bytes, shared_.peak_live_bytes, delta);
}

void HeapArena::AddCachedLocked(int64_t delta) {
  cached_bytes_ += delta;
  cached_hint_.store(cached_bytes_, std::memory_order_relaxed);
  // Growth was reserved in the shared figure by ReserveCacheLocked.
  if (delta < 0) shared_.cached_bytes.fetch_add(delta, std::memory_order_relaxed);
}

void HeapArena::AddCachedLocked(const Block& b, int64_t delta) {
  AddCachedLocked(delta);
  AccountPoolReserved(b, -delta);
}

void HeapArena::AccountPoolReserved(const Block& b, int64_t delta) {
  if (b.placement.stream_ordered) {
    AddWithPeak(shared_.pool_reserved_bytes, shared_.peak_pool_reserved_bytes, delta);
  }
}

bool HeapArena::ReserveCacheLocked(size_t size) {
  // Check and add in one step: two arenas freeing at once must not both
  // pass the device's limit.
  uint64_t now = shared_.cached_bytes.load(std::memory_order_relaxed);
  do {
    if (now + size > options_.cache_limit) return false;
  } while (!shared_.cached_bytes.compare_exchange_weak(now, now + size,
                                                        std::memory_order_relaxed));
  return true;
}

void HeapArena::SyncDeferredLocked() {
  const uint64_t now = deferred_.size();
  global_.deferred.fetch_add(now - stats_.deferred_frees, std::memory_order_acq_rel);
  stats_.deferred_frees = now;
}

void HeapArena::AccountMapped(DeviceSet peers, int64_t delta) {
  for (int d : peers) {
    PeerCounters& c = stats_.peers[d];
    c.mapped_bytes += delta;
    AddWithPeak(shared_.mapped_bytes[d], shared_.peak_mapped_bytes[d], delta);
  }
}

DeviceStats HeapArena::stats() const {
  MutexLock lock(&mu_);
  DeviceStats out = stats_;
  out.cached_bytes = cached_bytes_;
  for (const auto& [base, block] : blocks_) out.paused_blocks += block->paused ? 1 : 0;
  return out;
}

void HeapArena::AddResidency(DeviceResidency* out) const {
  MutexLock lock(&mu_);
  for (const auto& [base, b] : blocks_) {
    if (b->unmapped()) {
      out->tags[b->placement.tag].paused_bytes += b->size;
    } else if (b->cached || (b->slab != nullptr && b->slab->empty())) {
      out->cached_bytes += b->size;
    } else {
      out->tags[b->placement.tag].resident_bytes += b->size;
    }
  }
  for (const auto& [handle, size] : orphan_handles_) out->orphan_bytes += size;
  for (const OrphanMapping& m : orphan_mappings_) out->orphan_bytes += m.size;
}

void HeapArena::AddSegments(std::vector<SegmentInfo>* out) const {
  MutexLock lock(&mu_);
  for (const auto& [base, b] : blocks_) {
    SegmentInfo s;
    s.device = options_.device;
    s.address = base;
    s.size = b->size;
    s.tag = b->placement.tag;
    s.packed = b->slab != nullptr;
    s.stream_ordered = b->placement.stream_ordered;
    s.paused = b->paused;
    s.cached = b->cached;
    if (b->slab == nullptr) {
      SegmentPart part;
      part.size = b->size;
      if (!b->cached) {
        part.requested = b->requested;
        part.origin = b->origin;
        part.live = true;
      }
      s.parts.push_back(part);
    } else {
      // Live allocations take whole units; the gaps between them are free.
      uint64_t at = 0;
      b->slab->ForEach([&](size_t offset, size_t bytes, uint16_t origin) {
        if (offset > at) s.parts.push_back(SegmentPart{at, offset - at});
        const uint64_t taken = (bytes + Slab::kUnit - 1) / Slab::kUnit * Slab::kUnit;
        s.parts.push_back(SegmentPart{offset, taken, bytes, origin, true});
        at = offset + taken;
      });
      if (at < b->size) s.parts.push_back(SegmentPart{at, b->size - at});
    }
    out->push_back(std::move(s));
  }
}

}  // namespace vmmshim

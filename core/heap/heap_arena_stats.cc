// HeapArena (core/heap/heap_arena.h): its reports (statistics, residency,
// segments); the figures themselves change in ArenaAccounting.
#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/driver/cu_status.h"
#include "core/heap/heap_arena.h"

namespace vmmshim {

DeviceStats HeapArena::stats() const {
  MutexLock lock(&mu_);
  DeviceStats out = acct_.stats();
  out.cached_bytes = acct_.cached_bytes();
  out.compression = create_.state();
  for (const auto& [base, block] : blocks_.blocks()) out.paused_blocks += block->paused ? 1 : 0;
  return out;
}

void HeapArena::AddResidency(DeviceResidency* out) const {
  MutexLock lock(&mu_);
  for (const auto& [base, b] : blocks_.blocks()) {
    if (b->unmapped()) {
      TagResidency& t = out->tags[b->placement.tag];
      t.paused_bytes += b->size;
      if (!b->view.mapped()) t.paused_faulting_bytes += b->size;
    } else if (b->idle() && !b->pausing) {  // a pausing one is device memory until its commit
      out->cached_bytes += b->size;
    } else {
      out->tags[b->placement.tag].resident_bytes += b->size;
    }
  }
  out->orphan_bytes += orphans_.bytes();
}

void HeapArena::AddSegments(std::vector<SegmentInfo>* out) const {
  MutexLock lock(&mu_);
  for (const auto& [base, b] : blocks_.blocks()) {
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
      if (!b->cached && !b->freed_while_pausing) {
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

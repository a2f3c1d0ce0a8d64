#include "core/heap/types.h"

#include <algorithm>

namespace vmmshim {

StreamOrderedFigures& operator+=(StreamOrderedFigures& a, const StreamOrderedFigures& b) {
  a.reserved += b.reserved;
  a.reserved_high = std::max(a.reserved_high, b.reserved_high);
  a.used += b.used;
  a.used_high = std::max(a.used_high, b.used_high);
  a.cached += b.cached;
  a.live_allocations += b.live_allocations;
  a.allocations += b.allocations;
  a.reuses += b.reuses;
  a.frees += b.frees;
  a.driver_queries += b.driver_queries;
  a.release_threshold = std::max(a.release_threshold, b.release_threshold);
  return a;
}

DeviceStats& operator+=(DeviceStats& a, const DeviceStats& b) {
  a.allocations += b.allocations;
  a.bytes += b.bytes;
  a.frees += b.frees;
  a.live_allocations += b.live_allocations;
  a.live_bytes += b.live_bytes;
  a.peak_live_bytes = std::max(a.peak_live_bytes, b.peak_live_bytes);
  a.handles += b.handles;
  a.handle_bytes += b.handle_bytes;
  a.peak_handle_bytes = std::max(a.peak_handle_bytes, b.peak_handle_bytes);
  a.set_access_calls += b.set_access_calls;
  a.cache_hits += b.cache_hits;
  a.cache_misses += b.cache_misses;
  a.cached_bytes += b.cached_bytes;
  a.deferred_frees += b.deferred_frees;
  a.exports += b.exports;
  a.context_releases += b.context_releases;
  a.paused_bytes += b.paused_bytes;
  a.peak_paused_bytes = std::max(a.peak_paused_bytes, b.peak_paused_bytes);
  a.paused_blocks += b.paused_blocks;
  a.compression = std::max(a.compression, b.compression);
  for (int d = 0; d < kMaxDevices; ++d) {
    a.peers[d].grants += b.peers[d].grants;
    a.peers[d].denials += b.peers[d].denials;
    a.peers[d].mapped_bytes += b.peers[d].mapped_bytes;
    a.peers[d].peak_mapped_bytes =
        std::max(a.peers[d].peak_mapped_bytes, b.peers[d].peak_mapped_bytes);
  }
  a.stream_ordered += b.stream_ordered;
  return a;
}

}  // namespace vmmshim

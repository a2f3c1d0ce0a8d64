#include "core/heap/arena_accounting.h"

namespace vmmshim {

ArenaAccounting::ArenaAccounting(GlobalCounters& global, DeviceCounters& shared,
                                 size_t cache_limit, int device)
    : global_(global), shared_(shared), cache_limit_(cache_limit) {
  stats_.device = device;
}

void ArenaAccounting::Handle(int64_t delta) {
  if (delta > 0) {
    ++stats_.handles;
  } else {
    --stats_.handles;
  }
  stats_.handle_bytes += delta;
  AddWithPeak(shared_.handle_bytes, shared_.peak_handle_bytes, delta);
  AddWithPeak(global_.bytes, global_.peak, delta);
}

void ArenaAccounting::Paused(int64_t delta) {
  stats_.paused_bytes += delta;
  AddWithPeak(shared_.paused_bytes, shared_.peak_paused_bytes, delta);
  AddWithPeak(global_.paused, global_.paused_peak, delta);
}

void ArenaAccounting::Cached(bool stream_ordered, int64_t delta) {
  cached_bytes_ += delta;
  cached_hint_.store(cached_bytes_, std::memory_order_relaxed);
  // Growth was reserved in the shared figure by ReserveCache.
  if (delta < 0) shared_.cached_bytes.fetch_add(delta, std::memory_order_relaxed);
  PoolReserved(stream_ordered, -delta);
}

bool ArenaAccounting::ReserveCache(size_t size) {
  uint64_t now = shared_.cached_bytes.load(std::memory_order_relaxed);
  do {
    if (now + size > cache_limit_) return false;
  } while (!shared_.cached_bytes.compare_exchange_weak(now, now + size,
                                                        std::memory_order_relaxed));
  return true;
}

void ArenaAccounting::PoolReserved(bool stream_ordered, int64_t delta) {
  if (stream_ordered) {
    AddWithPeak(shared_.pool_reserved_bytes, shared_.peak_pool_reserved_bytes, delta);
  }
}

void ArenaAccounting::Mapped(DeviceSet peers, int64_t delta) {
  for (int d : peers) {
    stats_.peers[d].mapped_bytes += delta;
    AddWithPeak(shared_.mapped_bytes[d], shared_.peak_mapped_bytes[d], delta);
  }
}

void ArenaAccounting::SetDeferred(uint64_t count) {
  global_.deferred.fetch_add(count - stats_.deferred_frees, std::memory_order_acq_rel);
  stats_.deferred_frees = count;
}

}  // namespace vmmshim

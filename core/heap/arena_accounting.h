// The figures of one heap arena (DeviceStats) and the sums it shares with
// the other arenas of its device (DeviceCounters) and with every device of
// the process (GlobalCounters). Each figure changes in one method here,
// which updates all three levels, so they cannot drift and a peak is the
// peak of the sum.
//
// Units: bytes (counts where named). Deltas are signed: positive when
// memory joins the figure.
//
// Thread safety: an ArenaAccounting is guarded by its arena's mutex (every
// method but cached_hint() must be called under it); the shared counters are
// relaxed atomics (figures, not synchronization), so arenas update them
// without each other's locks.
#ifndef VMMSHIM_CORE_HEAP_ARENA_ACCOUNTING_H_
#define VMMSHIM_CORE_HEAP_ARENA_ACCOUNTING_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/base/device_set.h"
#include "core/heap/types.h"

namespace vmmshim {

// Process-wide figures that are sums over the heaps, so that a peak over all
// devices exists and "is anything deferred?" is one atomic load.
struct GlobalCounters {
  std::atomic<uint64_t> bytes{0};     // handle bytes, all devices
  std::atomic<uint64_t> peak{0};      // their peak
  std::atomic<uint64_t> deferred{0};  // deferred frees, all devices
  std::atomic<uint64_t> paused{0}, paused_peak{0};  // paused bytes, all devices
};

// A device's figures that are sums over its arenas and whose peaks must be
// peaks of the sum, and what the arenas share: the cache limit holds for all
// of them together, and a denial is logged once per pair whichever arena
// made it.
struct DeviceCounters {
  std::atomic<uint64_t> cached_bytes{0};
  std::atomic<uint64_t> live_bytes{0}, peak_live_bytes{0};
  std::atomic<uint64_t> handle_bytes{0}, peak_handle_bytes{0};
  std::array<std::atomic<uint64_t>, kMaxDevices> mapped_bytes{}, peak_mapped_bytes{};
  std::array<std::atomic<int>, kMaxDevices> denials_logged{};
  std::atomic<uint64_t> paused_bytes{0}, peak_paused_bytes{0};
  // The default pool's reserved bytes as the driver counts them
  // (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT / HIGH): the physical memory of
  // the blocks that hold stream-ordered allocations, live or freed and kept
  // by the stream-ordered cache; not the heap's cache (free to any request,
  // as memory a pool gives back is), not paused blocks. A small allocation
  // reserves its packed block, and the next ones in it leave the figure as
  // it is, as the driver's 32 MiB chunks do (docs/stream-ordered.md).
  std::atomic<uint64_t> pool_reserved_bytes{0}, peak_pool_reserved_bytes{0};
};

// value += delta, and peak = max(peak, value).
inline void AddWithPeak(std::atomic<uint64_t>& value, std::atomic<uint64_t>& peak,
                        int64_t delta) {
  const uint64_t now = value.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (delta <= 0) return;
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

class ArenaAccounting {
 public:
  // `global` and `shared` must outlive this. `cache_limit`: the bytes the
  // device's arenas together may keep cached.
  ArenaAccounting(GlobalCounters& global, DeviceCounters& shared, size_t cache_limit,
                  int device);
  ArenaAccounting(const ArenaAccounting&) = delete;
  ArenaAccounting& operator=(const ArenaAccounting&) = delete;

  // A physical handle of `delta` bytes made (> 0) or released (< 0).
  void Handle(int64_t delta);
  // Bytes released by a pause (> 0) or mapped again by a resume (< 0).
  void Paused(int64_t delta);
  // Requested bytes of live allocations.
  void Live(int64_t delta) {
    stats_.live_bytes += delta;
    AddWithPeak(shared_.live_bytes, shared_.peak_live_bytes, delta);
  }
  // Cached bytes of a block; `stream_ordered`: the block holds
  // stream-ordered memory, which leaves the pool's reserved bytes while
  // cached (and rejoins them when it leaves the cache). Growth must have
  // been reserved with ReserveCache first.
  void Cached(bool stream_ordered, int64_t delta);
  // Reserves `size` more cached bytes in the device's figure when they stay
  // within the cache limit; check and add are one step, so two arenas
  // freeing at once cannot both pass the limit.
  bool ReserveCache(size_t size);
  // The pool's reserved bytes, for a stream-ordered block only.
  void PoolReserved(bool stream_ordered, int64_t delta);
  // Bytes of this device's memory mapped into each of `peers`.
  void Mapped(DeviceSet peers, int64_t delta);
  // The deferred frees held now (a count).
  void SetDeferred(uint64_t count);

  DeviceStats& stats() { return stats_; }
  const DeviceStats& stats() const { return stats_; }
  size_t cached_bytes() const { return cached_bytes_; }
  // cached_bytes() without the arena's mutex: a hint that may change at once.
  size_t cached_hint() const { return cached_hint_.load(std::memory_order_relaxed); }
  // The denials of `peer` logged on this device so far, by any arena;
  // NextDenialLogged counts one more and returns the count before it.
  int NextDenialLogged(int peer) {
    return shared_.denials_logged[peer].fetch_add(1, std::memory_order_relaxed);
  }
  int DenialsLogged(int peer) const {
    return shared_.denials_logged[peer].load(std::memory_order_relaxed);
  }

 private:
  GlobalCounters& global_;
  DeviceCounters& shared_;
  const size_t cache_limit_;
  DeviceStats stats_;
  size_t cached_bytes_ = 0;
  std::atomic<size_t> cached_hint_{0};
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_ARENA_ACCOUNTING_H_

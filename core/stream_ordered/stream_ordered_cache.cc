#include "core/stream_ordered/stream_ordered_cache.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <new>

#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/stream_ordered/stream_ordered_internal.h"

namespace vmmshim {
using stream_ordered_internal::kHarvestPeriod;
using stream_ordered_internal::g_free_seq;
using stream_ordered_internal::g_pending;
using stream_ordered_internal::NowNs;


uint64_t ThisThreadId() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t id = next.fetch_add(1, std::memory_order_relaxed);
  return id;
}

StreamOrderedCache::~StreamOrderedCache() {
  g_pending.fetch_sub(static_cast<int64_t>(pending_), std::memory_order_acq_rel);
}

void StreamOrderedCache::AfterForkChild() { new (&mu_) Mutex; }

std::optional<StreamOrderedCache::Reuse> StreamOrderedCache::TakeLocked(
    const StreamKey& key, const Placement& placement, size_t size_class, size_t max_class) {
  CUdeviceptr ptr = 0;
  if (auto it = lists_.find(key); it != lists_.end()) {
    StreamList& list = it->second;
    for (auto c = list.by_class.lower_bound({size_class, 0});
         c != list.by_class.end() && c->first <= max_class; ++c) {
      auto s = list.by_seq.find(c->second);
      if (!Reusable(entries_.at(s->second), placement)) continue;
      ptr = s->second;
      list.by_seq.erase(s);
      list.by_class.erase(c);
      AddPendingLocked(-1);
      break;
    }
  }
  if (ptr == 0) {
    for (auto r = ready_.lower_bound({size_class, 0}); r != ready_.end() && r->first <= max_class;
         ++r) {
      if (!Reusable(entries_.at(r->second), placement)) continue;
      ptr = r->second;
      ready_.erase(r);
      break;
    }
    if (ptr == 0) return std::nullopt;
  }
  auto e = entries_.find(ptr);
  const Reuse reuse{ptr, e->second.bytes, e->second.size_class};
  f_.cached -= e->second.size_class;
  entries_.erase(e);
  return reuse;
}

void StreamOrderedCache::AddPendingLocked(int64_t delta) {
  pending_ = static_cast<size_t>(static_cast<int64_t>(pending_) + delta);
  g_pending.fetch_add(delta, std::memory_order_acq_rel);
}

uint64_t StreamOrderedCache::Mark() {
  return g_pending.load(std::memory_order_acquire) > 0 ? g_free_seq.load(std::memory_order_acquire)
                                                       : 0;
}

ReleasedBlocks StreamOrderedCache::Synchronized(const StreamKey& key,
                                                          bool whole_context, uint64_t mark) {
  MutexLock lock(&mu_);
  for (auto& [k, list] : lists_) {
    if (whole_context ? k.context == key.context : k == key) MarkListReadyLocked(list, mark);
  }
  if (whole_context) {
    // Destroyed streams of the context (their last event may be missing).
    MarkRetiredReadyLocked(mark, key.context);
  }
  return ReleaseReadyLocked(f_.release_threshold);
}

std::optional<StreamOrderedCache::Reuse> StreamOrderedCache::Allocate(
    const StreamKey& key, const Placement& placement, size_t size_class, size_t max_class,
    size_t bytes, bool may_ask, ReleasedBlocks* released) {
  MutexLock lock(&mu_);
  std::optional<Reuse> reuse = TakeLocked(key, placement, size_class, max_class);
  if (!reuse && may_ask && pending_ > 0) {
    const int64_t now = NowNs();
    if (now >= next_harvest_ns_) {
      // Only streams holding a block this allocation could take are asked:
      // blocks of other sizes wait for the program's next synchronize, the
      // periodic harvest or an out-of-memory (CuPy allocates a new size
      // most iterations, and paid a query per allocation otherwise).
      for (auto& [k, list] : lists_) {
        auto c = list.by_class.lower_bound({size_class, 0});
        if (c != list.by_class.end() && c->first <= max_class) {
          QueryListLocked(k, list, now, false);
        }
      }
      QueryRetiredLocked();  // destroyed streams: one event query each, rare
      reuse = TakeLocked(key, placement, size_class, max_class);
      *released = ReleaseReadyLocked(f_.release_threshold);
    }
  }
  if (reuse) NoteAllocatedLocked(placement.context, reuse->size_class, bytes, true);
  return reuse;
}

void StreamOrderedCache::NoteAllocated(CUcontext context, size_t size_class, size_t bytes,
                                       bool reused) {
  MutexLock lock(&mu_);
  NoteAllocatedLocked(context, size_class, bytes, reused);
}

void StreamOrderedCache::NoteAllocatedLocked(CUcontext context, size_t size_class, size_t bytes,
                                             bool reused) {
  Live& live = live_[context];
  live.classes += size_class;
  live.bytes += bytes;
  ++live.count;
  live_classes_ += size_class;
  ++f_.live_allocations;
  ++f_.allocations;
  if (reused) ++f_.reuses;
  f_.used += bytes;
  NoteHighLocked();
}

void StreamOrderedCache::NoteHighLocked() {
  f_.reserved_high = std::max<uint64_t>(f_.reserved_high, live_classes_ + f_.cached);
  f_.used_high = std::max(f_.used_high, f_.used);
}

absl::StatusOr<bool> StreamOrderedCache::Put(const StreamKey& key, CUdeviceptr ptr,
                                             const Placement& placement, bool reusable,
                                             size_t size_class, size_t bytes) {
  MutexLock lock(&mu_);
  if (entries_.contains(ptr)) return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync");
  const uint64_t seq = g_free_seq.fetch_add(1, std::memory_order_acq_rel) + 1;
  entries_[ptr] = Entry{size_class, bytes, seq, placement, reusable, false, false, key};
  const CUcontext context = placement.context;
  StreamList& list = lists_[key];
  list.by_class.insert({size_class, seq});
  list.by_seq[seq] = ptr;
  AddPendingLocked(1);
  // A harvest may help from when this stream may be asked again.
  next_harvest_ns_ = std::min(next_harvest_ns_, list.next_query_ns);
  // The reserved bytes stay: the block moves from live to cached.
  f_.cached += size_class;
  if (auto it = live_.find(context); it != live_.end()) {
    it->second.classes -= size_class;
    it->second.bytes -= bytes;
    --it->second.count;
    live_classes_ -= size_class;
    --f_.live_allocations;
    f_.used -= bytes;
  }
  ++f_.frees;
  return ++puts_since_harvest_ >= kHarvestPeriod;
}

bool StreamOrderedCache::Contains(CUdeviceptr ptr) const {
  MutexLock lock(&mu_);
  return entries_.contains(ptr);
}

void StreamOrderedCache::NoteFreed(CUcontext context, size_t size_class, size_t bytes) {
  MutexLock lock(&mu_);
  auto it = live_.find(context);
  if (it == live_.end()) return;  // released with its context already
  it->second.classes -= size_class;
  it->second.bytes -= bytes;
  --it->second.count;
  live_classes_ -= size_class;
  --f_.live_allocations;
  ++f_.frees;
  f_.used -= bytes;
}

void StreamOrderedCache::MakeReadyLocked(CUdeviceptr ptr) {
  Entry& e = entries_.at(ptr);
  e.ready = true;
  e.retired = false;
  if (e.reusable) {
    ready_.insert({e.size_class, ptr});
  } else {
    release_now_.insert(ptr);
  }
  AddPendingLocked(-1);
}

bool StreamOrderedCache::Holds(CUcontext context) const {
  MutexLock lock(&mu_);
  if (live_.contains(context)) return true;
  for (const auto& [key, list] : lists_) {
    if (key.context == context) return true;
  }
  for (const Retired& r : retired_) {
    if (r.context == context) return true;
  }
  for (const auto& [ptr, e] : entries_) {
    if (e.placement.context == context) return true;
  }
  return false;
}

void StreamOrderedCache::RemoveLocked(CUdeviceptr ptr) {
  auto it = entries_.find(ptr);
  const Entry& e = it->second;
  if (e.ready) {
    ready_.erase({e.size_class, ptr});
    release_now_.erase(ptr);
  } else if (e.retired) {
    for (Retired& r : retired_) r.blocks.erase(std::remove(r.blocks.begin(), r.blocks.end(), ptr),
                                               r.blocks.end());
    AddPendingLocked(-1);
  } else {
    StreamList& list = lists_.at(e.key);
    list.by_class.erase({e.size_class, e.seq});
    list.by_seq.erase(e.seq);
    AddPendingLocked(-1);
  }
  f_.cached -= e.size_class;
  entries_.erase(it);
}

ReleasedBlocks StreamOrderedCache::DropContext(CUcontext context) {
  MutexLock lock(&mu_);
  if (auto it = live_.find(context); it != live_.end()) {
    live_classes_ -= it->second.classes;
    f_.used -= it->second.bytes;
    f_.live_allocations -= it->second.count;
    live_.erase(it);
  }
  // Everything freed on the context's streams is ready now (the context
  // was synchronized, or is gone).
  for (auto it = lists_.begin(); it != lists_.end();) {
    if (it->first.context != context) {
      ++it;
      continue;
    }
    MarkListReadyLocked(it->second, UINT64_MAX);
    lists_.erase(it++);  // its event goes with the context
  }
  for (auto it = retired_.begin(); it != retired_.end();) {
    if (it->context != context) {
      ++it;
      continue;
    }
    for (CUdeviceptr ptr : it->blocks) MakeReadyLocked(ptr);
    it = retired_.erase(it);
  }
  // Blocks of `context` are the heap's to release with it; blocks of other
  // contexts freed on its streams go back to the caller for a free.
  std::vector<CUdeviceptr> mine;
  ReleasedBlocks others;
  for (const auto& [ptr, e] : entries_) {
    if (e.placement.context == context) {
      mine.push_back(ptr);
    } else if (e.key.context == context) {
      others.push_back({ptr, e.placement.context});
    }
  }
  for (CUdeviceptr ptr : mine) RemoveLocked(ptr);
  for (const ReleasedBlock& b : others) RemoveLocked(b.ptr);
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                [](const Retired& r) { return r.blocks.empty(); }),
                 retired_.end());
  return others;
}

StreamOrderedFigures StreamOrderedCache::figures() const {
  MutexLock lock(&mu_);
  StreamOrderedFigures out = f_;
  out.reserved = live_classes_ + f_.cached;
  return out;
}

void StreamOrderedCache::ResetHigh(bool reserved) {
  MutexLock lock(&mu_);
  if (reserved) {
    f_.reserved_high = live_classes_ + f_.cached;
  } else {
    f_.used_high = f_.used;
  }
}

void StreamOrderedCache::SetReleaseThreshold(uint64_t bytes) {
  MutexLock lock(&mu_);
  f_.release_threshold = bytes;
}

}  // namespace vmmshim

#include "core/stream_ordered/stream_ordered_cache.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <new>

#include "core/driver/cu_status.h"

namespace vmmshim {
namespace {

// Every this many frees, the caller harvests: blocks freed on streams that
// never allocate again become ready for the others, and the release
// threshold applies, at one cuStreamQuery per stream per period.
constexpr size_t kHarvestPeriod = 256;

// Makes `context` current for the scope when it is not (events belong to
// the context current at their creation; CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD name a stream of the current context).
class ContextScope {
 public:
  ContextScope(const DriverApi& driver, CUcontext context) : driver_(driver) {
    CUcontext current = nullptr;
    if (context == nullptr || driver_.cuCtxGetCurrent(&current) != CUDA_SUCCESS ||
        current == context) {
      return;
    }
    pushed_ = driver_.cuCtxPushCurrent_v2(context) == CUDA_SUCCESS;
  }
  ~ContextScope() {
    if (!pushed_) return;
    CUcontext popped = nullptr;
    driver_.cuCtxPopCurrent_v2(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const DriverApi& driver_;
  bool pushed_ = false;
};

// Frees are numbered process-wide, so that one mark taken before a
// synchronize covers every cache; and the blocks not yet ready are counted
// process-wide, so that a synchronize hook with nothing to do costs one load.
std::atomic<uint64_t> g_free_seq{0};
std::atomic<int64_t> g_pending{0};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

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

void StreamOrderedCache::MarkListReadyLocked(StreamList& list, uint64_t upto) {
  for (auto it = list.by_seq.begin(); it != list.by_seq.end() && it->first <= upto;) {
    const CUdeviceptr ptr = it->second;
    list.by_class.erase({entries_.at(ptr).size_class, it->first});
    MakeReadyLocked(ptr);
    it = list.by_seq.erase(it);
  }
}

void StreamOrderedCache::QueryListLocked(const StreamKey& key, StreamList& list, int64_t now,
                                         bool force) {
  if (list.by_seq.empty()) return;
  if (!force && now < list.next_query_ns) return;
  if (list.event_pending) {
    ++f_.driver_queries;
    const CUresult r = driver_.cuEventQuery(list.event);
    if (r == CUDA_SUCCESS) MarkListReadyLocked(list, list.event_covers);
    if (r != CUDA_ERROR_NOT_READY) list.event_pending = false;
    if (list.by_seq.empty()) return;
    if (list.event_pending) {
      // Work queued before the event is not done, so neither is the stream.
      list.next_query_ns = now + query_interval_ns_;
      return;
    }
  }
  // The per-thread default stream is the calling thread's.
  if (key.stream == CU_STREAM_PER_THREAD && key.thread != ThisThreadId()) return;
  if (driver_.cuStreamQuery == nullptr) return;
  const uint64_t mark = g_free_seq.load(std::memory_order_acquire);
  ContextScope scope(driver_, key.context);
  ++f_.driver_queries;
  const CUresult r = driver_.cuStreamQuery(key.stream);
  if (r == CUDA_SUCCESS) {
    MarkListReadyLocked(list, mark);
    return;
  }
  list.next_query_ns = now + query_interval_ns_;
  if (r != CUDA_ERROR_NOT_READY) return;
  if (driver_.cuEventCreate == nullptr || driver_.cuEventRecord == nullptr) return;
  if (list.event == nullptr &&
      driver_.cuEventCreate(&list.event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    list.event = nullptr;
    return;
  }
  ++f_.driver_queries;
  if (driver_.cuEventRecord(list.event, key.stream) == CUDA_SUCCESS) {
    list.event_covers = mark;
    list.event_pending = true;
  }
}

ReleasedBlocks StreamOrderedCache::ReleaseReadyLocked(uint64_t keep) {
  ReleasedBlocks out;
  for (CUdeviceptr ptr : release_now_) {
    const Entry& e = entries_.at(ptr);
    f_.cached -= e.size_class;
    out.push_back({ptr, e.placement.context});
    entries_.erase(ptr);
  }
  release_now_.clear();
  while (live_classes_ + f_.cached > keep && !ready_.empty()) {
    auto last = std::prev(ready_.end());  // the largest first: the fewest frees
    const CUdeviceptr ptr = last->second;
    f_.cached -= last->first;
    ready_.erase(last);
    out.push_back({ptr, entries_.at(ptr).placement.context});
    entries_.erase(ptr);
  }
  return out;
}

void StreamOrderedCache::QueryRetiredLocked() {
  for (auto it = retired_.begin(); it != retired_.end();) {
    if (it->event == nullptr || driver_.cuEventQuery(it->event) != CUDA_SUCCESS) {
      ++it;
      continue;
    }
    for (CUdeviceptr ptr : it->blocks) MakeReadyLocked(ptr);
    if (driver_.cuEventDestroy_v2 != nullptr) driver_.cuEventDestroy_v2(it->event);
    it = retired_.erase(it);
  }
}

void StreamOrderedCache::HarvestLocked(bool force) {
  puts_since_harvest_ = 0;
  const int64_t now = NowNs();
  for (auto& [key, list] : lists_) QueryListLocked(key, list, now, force);
  QueryRetiredLocked();
  // The earliest time a list with blocks may be asked again.
  next_harvest_ns_ = std::numeric_limits<int64_t>::max();
  for (const auto& [key, list] : lists_) {
    if (!list.by_seq.empty()) next_harvest_ns_ = std::min(next_harvest_ns_, list.next_query_ns);
  }
  if (!retired_.empty()) next_harvest_ns_ = 0;
}

ReleasedBlocks StreamOrderedCache::Harvest(std::optional<uint64_t> keep, bool force) {
  MutexLock lock(&mu_);
  HarvestLocked(force);
  return ReleaseReadyLocked(keep.value_or(f_.release_threshold));
}

uint64_t StreamOrderedCache::PendingContexts(std::vector<CUcontext>* contexts) const {
  MutexLock lock(&mu_);
  auto add = [contexts](CUcontext c) {
    if (std::find(contexts->begin(), contexts->end(), c) == contexts->end()) {
      contexts->push_back(c);
    }
  };
  for (const auto& [key, list] : lists_) {
    if (!list.by_seq.empty()) add(key.context);
  }
  for (const Retired& r : retired_) add(r.context);
  return g_free_seq.load(std::memory_order_acquire);
}

void StreamOrderedCache::MarkReady(uint64_t mark) {
  MutexLock lock(&mu_);
  for (auto& [key, list] : lists_) MarkListReadyLocked(list, mark);
  MarkRetiredReadyLocked(mark, nullptr);
}

void StreamOrderedCache::MarkRetiredReadyLocked(uint64_t mark, CUcontext only) {
  for (auto it = retired_.begin(); it != retired_.end();) {
    if (only != nullptr && it->context != only) {
      ++it;
      continue;
    }
    auto& blocks = it->blocks;
    for (auto b = blocks.begin(); b != blocks.end();) {
      if (entries_.at(*b).seq <= mark) {
        MakeReadyLocked(*b);
        b = blocks.erase(b);
      } else {
        ++b;
      }
    }
    if (!blocks.empty()) {
      ++it;
      continue;
    }
    if (it->event != nullptr && driver_.cuEventDestroy_v2 != nullptr) {
      driver_.cuEventDestroy_v2(it->event);
    }
    it = retired_.erase(it);
  }
}

void StreamOrderedCache::StreamDestroyed(CUstream stream, bool may_query) {
  MutexLock lock(&mu_);
  for (auto it = lists_.begin(); it != lists_.end();) {
    if (it->first.stream != stream) {
      ++it;
      continue;
    }
    const StreamKey key = it->first;
    StreamList& list = it->second;
    if (!list.by_seq.empty()) {
      ContextScope scope(driver_, may_query ? key.context : nullptr);
      if (may_query && driver_.cuStreamQuery != nullptr &&
          driver_.cuStreamQuery(stream) == CUDA_SUCCESS) {
        MarkListReadyLocked(list, UINT64_MAX);
      } else {
        Retired r;
        r.context = key.context;
        if (may_query && list.event == nullptr && driver_.cuEventCreate != nullptr &&
            driver_.cuEventCreate(&list.event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
          list.event = nullptr;
        }
        // Without an event the blocks wait for a synchronize of the context
        // or an out-of-memory (MarkRetiredReadyLocked).
        if (may_query && list.event != nullptr && driver_.cuEventRecord != nullptr &&
            driver_.cuEventRecord(list.event, stream) == CUDA_SUCCESS) {
          r.event = list.event;
          list.event = nullptr;
        }
        for (const auto& [seq, ptr] : list.by_seq) {
          r.blocks.push_back(ptr);
          entries_.at(ptr).retired = true;
        }
        retired_.push_back(std::move(r));
      }
    }
    // (During a capture the event is left to its context.)
    if (may_query && list.event != nullptr && driver_.cuEventDestroy_v2 != nullptr) {
      driver_.cuEventDestroy_v2(list.event);
    }
    lists_.erase(it++);
  }
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

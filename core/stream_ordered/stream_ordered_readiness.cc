// StreamOrderedCache (core/stream_ordered/stream_ordered_cache.h): when freed
// blocks become ready for other streams: stream queries, events, the
// program's synchronizes, destroyed streams, and the harvests that apply the
// release threshold.
#include <algorithm>
#include <vector>

#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/stream_ordered/stream_ordered_cache.h"
#include "core/stream_ordered/stream_ordered_internal.h"

namespace vmmshim {

using stream_ordered_internal::g_free_seq;
using stream_ordered_internal::NowNs;

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

ReleasedBlocks StreamOrderedCache::TakeSelected(const TagSelection& selection) {
  MutexLock lock(&mu_);
  ReleasedBlocks out;
  for (const auto& [ptr, e] : entries_) {
    if (e.ready && selection.Matches(e.placement.tag)) out.push_back({ptr, e.placement.context});
  }
  for (const ReleasedBlock& b : out) RemoveLocked(b.ptr);
  return out;
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

}  // namespace vmmshim

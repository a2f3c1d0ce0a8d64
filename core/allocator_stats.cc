#include "core/allocator_stats.h"

namespace vmmshim {

void CallCounters::AddTo(AllocatorStats* s) const {
  s->passthrough_allocations = passthrough_allocations_.load(std::memory_order_relaxed);
  s->passthrough_bytes = passthrough_bytes_.load(std::memory_order_relaxed);
}

void CallCounters::PassThroughLive(CUdeviceptr ptr, size_t bytes, int device) {
  PassThrough(bytes);
  MutexLock lock(&live_mu_);
  live_[ptr] = {bytes, device};
  live_count_.store(live_.size(), std::memory_order_relaxed);
}

void CallCounters::PassThroughFreed(CUdeviceptr ptr) {
  if (live_count_.load(std::memory_order_relaxed) == 0) return;
  MutexLock lock(&live_mu_);
  live_.erase(ptr);
  live_count_.store(live_.size(), std::memory_order_relaxed);
}

uint64_t CallCounters::PassedThroughLive(int device) const {
  MutexLock lock(&live_mu_);
  uint64_t bytes = 0;
  for (const auto& [ptr, entry] : live_) {
    if (entry.second == device) bytes += entry.first;
  }
  return bytes;
}

}  // namespace vmmshim

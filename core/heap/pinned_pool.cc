#include "core/heap/pinned_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <system_error>
#include <vector>

#include "core/base/host_memory.h"
#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/driver/host_registration.h"
#include "core/sync/capture.h"

namespace vmmshim {
namespace {

// Writes [p, p + bytes) with `threads` threads: the first touch of every
// page (zeroing, huge-page assembly) is the half of pinning's cost that
// threads share (bench/page_lock_speed: 28-37 GiB/s with 16 threads).
void TouchInParallel(char* p, size_t bytes, int threads) {
  const size_t part = RoundUp(std::max<size_t>(bytes / std::max(1, threads), 1),
                              PinnedPool::kAlignment);
  std::vector<std::thread> workers;
  for (size_t from = 0; from < bytes; from += part) {
    const size_t n = std::min(part, bytes - from);
    try {
      workers.emplace_back([=] { std::memset(p + from, 0, n); });
    } catch (const std::system_error&) {
      std::memset(p + from, 0, n);  // no thread to be had (a pids limit)
    }
  }
  for (std::thread& t : workers) t.join();
}

}  // namespace

PinnedPool::~PinnedPool() {
  if (filler_.joinable()) filler_.join();
  Unpin();
  MutexLock lock(&mu_);
  if (memory_ != nullptr) munmap(memory_, bytes_);
}

size_t PinnedPool::AllowedBytes(size_t bytes, const HostMemoryHeadroom& headroom) {
  // Whole huge pages, and no request so large that rounding it up wraps.
  const size_t cap = headroom.bytes == SIZE_MAX ? SIZE_MAX / 2 : headroom.bytes / 4 * 3;
  if (bytes <= cap) return bytes;
  return cap / kAlignment * kAlignment;
}

void PinnedPool::Start(size_t bytes, CUcontext context, int threads, size_t chunk_bytes) {
  if (bytes == 0 || context == nullptr) return;
  MutexLock lock(&mu_);
  if (state_ != State::kNone) return;
  // Page-locked memory cannot be reclaimed: a pool past what the machine or
  // the memory cgroup has left would get the process OOM-killed at its fill.
  const HostMemoryHeadroom headroom = HostMemoryHeadroomNow();
  const size_t allowed = AllowedBytes(bytes, headroom);
  if (allowed < bytes) {
    if (allowed == 0) {
      Log().warn("pinned pool of {} bytes refused: {} bytes of host memory left ({}); pauses "
                 "copy without it",
                 bytes, headroom.bytes, headroom.limited_by);
      state_ = State::kFailed;
      filled_.SignalAll();
      return;
    }
    Log().warn("pinned pool of {} bytes cut to {} bytes: {} bytes of host memory left ({}), of "
               "which the pool takes at most 3/4",
               bytes, allowed, headroom.bytes, headroom.limited_by);
    bytes = allowed;
  }
  state_ = State::kFilling;
  bytes = RoundUp(bytes, kAlignment);
  chunk_bytes = RoundUp(std::max<size_t>(chunk_bytes, 1), kAlignment);
  try {
    filler_ = std::thread([this, bytes, context, threads, chunk_bytes] {
      RelaxCaptureModeOfThisThread(driver_);  // Note [The shim's own threads and captures]
      Fill(bytes, context, threads, chunk_bytes);
    });
  } catch (const std::system_error& e) {
    Log().warn("pinned pool of {} bytes: no thread to make it ({}); pauses copy without it",
               bytes, e.what());
    state_ = State::kFailed;
    filled_.SignalAll();
  }
}

void PinnedPool::Fill(size_t bytes, CUcontext context, int threads, size_t chunk_bytes) {
  const auto start = std::chrono::steady_clock::now();
  auto fail = [&](const std::string& why) {
    Log().warn("pinned pool of {} bytes: {}; pauses copy without it", bytes, why);
    MutexLock lock(&mu_);
    state_ = State::kFailed;
    filled_.SignalAll();
  };
  if (driver_.cuMemHostRegister_v2 == nullptr || driver_.cuMemHostUnregister == nullptr ||
      driver_.cuMemHostGetFlags == nullptr) {
    return fail("the driver lacks cuMemHostRegister");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fail(std::string("mmap: ") + std::strerror(errno));
  char* memory = static_cast<char*>(p);
  madvise(memory, bytes, MADV_HUGEPAGE);
  madvise(memory, bytes, MADV_DONTFORK);
  TouchInParallel(memory, bytes, threads);
  {
    ContextScope scope(driver_, context);  // this thread has none of its own
    for (size_t from = 0; from < bytes; from += chunk_bytes) {
      const CUresult r = driver_.cuMemHostRegister_v2(
          memory + from, std::min(chunk_bytes, bytes - from), CU_MEMHOSTREGISTER_PORTABLE);
      if (r == CUDA_SUCCESS) continue;
      for (size_t done = 0; done < from; done += chunk_bytes) {
        driver_.cuMemHostUnregister(memory + done);
      }
      munmap(memory, bytes);
      return fail("cuMemHostRegister: " + CuResultName(r));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Log().info("pinned pool: {} bytes page-locked in {:.3f} s ({:.1f} GiB/s)", bytes, seconds,
             bytes / seconds / double(size_t{1} << 30));
  MutexLock lock(&mu_);
  memory_ = memory;
  bytes_ = bytes;
  chunk_bytes_ = chunk_bytes;
  registered_in_.assign((bytes + chunk_bytes - 1) / chunk_bytes, context);
  fill_seconds_ = seconds;
  free_.clear();
  free_[0] = bytes;
  state_ = State::kReady;
  filled_.SignalAll();
}

char* PinnedPool::Take(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t want = RoundUp(bytes, kAlignment);
  MutexLock lock(&mu_);
  AwaitFillLocked();
  if (state_ != State::kReady) return nullptr;
  // Best fit: the smallest free range that holds it, so that a large
  // backup later still finds room.
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= want && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best == free_.end()) return nullptr;
  const size_t offset = best->first, left = best->second - want;
  free_.erase(best);
  if (left > 0) free_[offset + want] = left;
  return memory_ + offset;
}

void PinnedPool::Give(char* range, size_t bytes) {
  if (range == nullptr) return;
  MutexLock lock(&mu_);
  if (memory_ == nullptr || range < memory_ || range >= memory_ + bytes_) return;
  size_t offset = static_cast<size_t>(range - memory_), size = RoundUp(bytes, kAlignment);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_[offset] = size;
}

bool PinnedPool::Usable() {
  MutexLock lock(&mu_);
  AwaitFillLocked();
  if (state_ != State::kReady) return false;
  for (size_t k = 0; k < registered_in_.size(); ++k) {
    // Dropped with its context: registered again when a copy needs it.
    if (registered_in_[k] != nullptr &&
        !HostRegistrationAlive(driver_, memory_ + k * chunk_bytes_, registered_in_[k])) {
      registered_in_[k] = nullptr;
    }
  }
  return true;
}

absl::StatusOr<size_t> PinnedPool::PinForCopy(const char* p, size_t bytes) {
  MutexLock lock(&mu_);
  if (state_ != State::kReady || p < memory_ || p >= memory_ + bytes_) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "a copy outside the pinned pool");
  }
  const size_t offset = static_cast<size_t>(p - memory_), k = offset / chunk_bytes_;
  if (registered_in_[k] == nullptr) {
    CUcontext current = nullptr;
    driver_.cuCtxGetCurrent(&current);
    if (CUresult r = driver_.cuMemHostRegister_v2(memory_ + k * chunk_bytes_, ChunkSize(k),
                                                  CU_MEMHOSTREGISTER_PORTABLE);
        r != CUDA_SUCCESS) {
      return DriverError(r, "cuMemHostRegister (a chunk of the pinned pool)");
    }
    registered_in_[k] = current;
  }
  return std::min(bytes, k * chunk_bytes_ + ChunkSize(k) - offset);
}

size_t PinnedPool::Unpin() {
  MutexLock lock(&mu_);
  AwaitFillLocked();
  size_t unpinned = 0;
  for (size_t k = 0; k < registered_in_.size(); ++k) {
    if (registered_in_[k] == nullptr) continue;
    UnregisterHostMemory(driver_, memory_ + k * chunk_bytes_, registered_in_[k], "the pinned pool");
    registered_in_[k] = nullptr;
    unpinned += ChunkSize(k);
  }
  return unpinned;
}

void PinnedPool::AwaitFill() {
  MutexLock lock(&mu_);
  AwaitFillLocked();
}

PinnedPool::Stats PinnedPool::stats() const {
  MutexLock lock(&mu_);
  Stats s;
  if (state_ != State::kReady) return s;
  s.bytes = bytes_;
  for (const auto& [offset, size] : free_) s.free_bytes += size;
  for (size_t k = 0; k < registered_in_.size(); ++k) {
    if (registered_in_[k] != nullptr) s.pinned_bytes += ChunkSize(k);
  }
  s.fill_seconds = fill_seconds_;
  return s;
}

void PinnedPool::AfterForkChild() {
  // The parent's fill thread does not exist here; its object is dropped
  // without a join, and the memory was not inherited.
  new (&filler_) std::thread();
  new (&mu_) Mutex;
  new (&filled_) CondVar;
  state_ = State::kNone;
  memory_ = nullptr;
  bytes_ = 0;
  registered_in_.clear();
  free_.clear();
}

}  // namespace vmmshim

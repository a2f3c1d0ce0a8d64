#include "core/heap/pinned_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <system_error>
#include <vector>

#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/driver/host_registration.h"

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
  MutexLock lock(&mu_);
  if (memory_ == nullptr) return;
  if (registered_) UnregisterHostMemory(driver_, memory_, context_, "the pinned pool");
  munmap(memory_, bytes_);
}

void PinnedPool::Start(size_t bytes, CUcontext context, int threads) {
  if (bytes == 0 || context == nullptr) return;
  MutexLock lock(&mu_);
  if (state_ != State::kNone) return;
  state_ = State::kFilling;
  bytes = RoundUp(bytes, kAlignment);
  try {
    filler_ = std::thread([this, bytes, context, threads] { Fill(bytes, context, threads); });
  } catch (const std::system_error& e) {
    Log().warn("pinned pool of {} bytes: no thread to make it ({}); pauses copy without it",
               bytes, e.what());
    state_ = State::kFailed;
    filled_.SignalAll();
  }
}

void PinnedPool::Fill(size_t bytes, CUcontext context, int threads) {
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
  CUresult r;
  {
    ContextScope scope(driver_, context);  // this thread has none of its own
    r = driver_.cuMemHostRegister_v2(memory, bytes, CU_MEMHOSTREGISTER_PORTABLE);
  }
  if (r != CUDA_SUCCESS) {
    munmap(memory, bytes);
    return fail("cuMemHostRegister: " + CuResultName(r) + " (a memlock limit? ulimit -l)");
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Log().info("pinned pool: {} bytes page-locked in {:.3f} s ({:.1f} GiB/s)", bytes, seconds,
             bytes / seconds / double(size_t{1} << 30));
  MutexLock lock(&mu_);
  memory_ = memory;
  bytes_ = bytes;
  registered_ = true;
  context_ = context;
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

bool PinnedPool::EnsureRegistered() {
  MutexLock lock(&mu_);
  AwaitFillLocked();
  if (state_ != State::kReady) return false;
  if (registered_ && HostRegistrationAlive(driver_, memory_, context_)) return true;
  // Dropped with its context: pinned again in the current one.
  registered_ = false;
  CUcontext current = nullptr;
  driver_.cuCtxGetCurrent(&current);
  if (CUresult r = driver_.cuMemHostRegister_v2(memory_, bytes_, CU_MEMHOSTREGISTER_PORTABLE);
      r != CUDA_SUCCESS) {
    Log().warn("pinned pool: registering again after its context went: {}; pauses copy "
               "without it",
               CuResultName(r));
    return false;
  }
  registered_ = true;
  context_ = current;
  return true;
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
  registered_ = false;
  context_ = nullptr;
  free_.clear();
}

}  // namespace vmmshim

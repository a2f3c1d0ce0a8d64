#include "core/context_sync.h"

#include <new>
#include <thread>

namespace vmmshim {
namespace {

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

SyncCombiner::Slot* SyncCombiner::SlotFor(CUcontext context) {
  // Open addressing over the context handle; slots are never freed, so a
  // lookup that meets an empty slot knows the context is absent.
  const size_t start = (reinterpret_cast<uintptr_t>(context) >> 4) % kSlots;
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = slots_[(start + i) % kSlots];
    CUcontext seen = s.context.load(std::memory_order_acquire);
    if (seen == context) return &s;
    if (seen == nullptr &&
        (s.context.compare_exchange_strong(seen, context, std::memory_order_acq_rel) ||
         seen == context)) {
      return &s;
    }
  }
  return nullptr;
}

absl::Status SyncCombiner::Synchronize(CUcontext context) {
  Slot* s = context == nullptr ? nullptr : SlotFor(context);
  if (s == nullptr) {
    synchronizes_.fetch_add(1, std::memory_order_relaxed);
    return sync_(context);
  }
  std::unique_lock<std::mutex> lock(s->mu);
  // A running synchronize began before this call and does not cover it: the
  // next one to begin does.
  const uint64_t need = s->started + 1;
  bool ran = false;
  while (s->finished.load(std::memory_order_relaxed) < need) {
    if (!s->running) {
      s->running = true;
      const uint64_t mine = ++s->started;
      lock.unlock();
      absl::Status status = sync_(context);
      synchronizes_.fetch_add(1, std::memory_order_relaxed);
      lock.lock();
      s->running = false;
      s->last = std::move(status);
      s->finished.store(mine, std::memory_order_release);
      ran = true;
      if (s->waiters > 0) s->done.notify_all();
      continue;
    }
    // Spin first: the running synchronize usually ends within microseconds,
    // and sleeping would add a wake-up to every waiter.
    lock.unlock();
    const uint64_t running = need - 1;
    for (int i = 0; i < 2000 && s->finished.load(std::memory_order_acquire) < running; ++i) {
      CpuRelax();
    }
    lock.lock();
    if (s->running && s->finished.load(std::memory_order_relaxed) < running) {
      ++s->waiters;
      s->done.wait(lock, [&] { return !s->running; });
      --s->waiters;
    }
  }
  if (!ran) shared_.fetch_add(1, std::memory_order_relaxed);
  return s->last;
}

void SyncCombiner::AfterForkChild() {
  // The parent's other threads do not exist here: fresh locks, no synchronize
  // running.
  for (Slot& s : slots_) {
    new (&s.mu) std::mutex;
    new (&s.done) std::condition_variable;
    s.running = false;
    s.waiters = 0;
  }
}

}  // namespace vmmshim

#include "core/sync/context_sync.h"

#include <thread>

#include "core/driver/cu_status.h"

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
  // Every synchronize numbered above what is read here begins after this
  // call did, so the next number covers it (a conservative bound: one that
  // begins between the call and this read only makes it wait one more).
  // A read-modify-write, not a load: the leader's numbering RMW then
  // synchronizes with it, so this thread's work queued before the free
  // happens before the leader's cuCtxSynchronize.
  const uint64_t need = s->started.fetch_add(0, std::memory_order_acq_rel) + 1;
  int spins = 0;
  while (s->finished.load(std::memory_order_acquire) < need) {
    bool idle = false;
    if (!s->running.load(std::memory_order_relaxed) &&
        s->running.compare_exchange_strong(idle, true, std::memory_order_acq_rel)) {
      const uint64_t mine = s->started.fetch_add(1, std::memory_order_acq_rel) + 1;
      absl::Status status = sync_(context);
      synchronizes_.fetch_add(1, std::memory_order_relaxed);
      s->result.store(static_cast<int>(ToCuResult(status)), std::memory_order_relaxed);
      s->finished.store(mine, std::memory_order_release);
      s->running.store(false, std::memory_order_release);
      return status;
    }
    // Another caller runs one; it may have begun before this call (then
    // the next one is needed, which a waiter starts once it ends).
    if (++spins < 256) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  shared_.fetch_add(1, std::memory_order_relaxed);
  const auto code = static_cast<CUresult>(s->result.load(std::memory_order_relaxed));
  return code == CUDA_SUCCESS ? absl::OkStatus() : DriverError(code, "cuCtxSynchronize");
}

void SyncCombiner::AfterForkChild() {
  // The parent's other threads do not exist here: no synchronize is running.
  for (Slot& s : slots_) s.running.store(false, std::memory_order_relaxed);
}

}  // namespace vmmshim

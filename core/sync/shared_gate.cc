#include "core/sync/shared_gate.h"

#include "core/base/tls.h"

#include <array>
#include <new>
#include <thread>

namespace vmmshim {

void SharedGate::Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  writers_.Lock();
  writer_.store(true, std::memory_order_seq_cst);
  for (Counter& c : counters_) {
    while (c.readers.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  }
}

void SharedGate::Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  writer_.store(false, std::memory_order_seq_cst);
  writers_.Unlock();
}

namespace {

// The read locks this thread holds, per gate: a nested read lock must not
// wait for a writer, which is itself waiting for this thread's first one.
struct Held {
  const SharedGate* gate = nullptr;
  int depth = 0;
};
VMMSHIM_INITIAL_EXEC_TLS thread_local std::array<Held, 4> t_held;

Held* HeldEntry(const SharedGate* gate, bool make) {
  Held* free = nullptr;
  for (Held& h : t_held) {
    if (h.gate == gate) return &h;
    if (h.gate == nullptr && free == nullptr) free = &h;
  }
  if (make && free != nullptr) free->gate = gate;
  return make ? free : nullptr;
}

}  // namespace

void SharedGate::ReaderLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::atomic<int>& mine = counters_[ThreadSlot()].readers;
  Held* held = HeldEntry(this, /*make=*/true);
  if (held != nullptr && held->depth > 0) {
    // Already a reader: no writer can be inside, and one waiting waits for
    // this thread anyway.
    mine.fetch_add(1, std::memory_order_seq_cst);
    ++held->depth;
    return;
  }
  if (held != nullptr) held->depth = 1;
  while (true) {
    mine.fetch_add(1, std::memory_order_seq_cst);
    if (!writer_.load(std::memory_order_seq_cst)) return;
    // A writer holds or is taking the gate: step back so it can drain the
    // counters, and wait for it.
    mine.fetch_sub(1, std::memory_order_seq_cst);
    while (writer_.load(std::memory_order_seq_cst)) std::this_thread::yield();
  }
}

void SharedGate::ReaderUnlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (Held* held = HeldEntry(this, /*make=*/false); held != nullptr && --held->depth == 0) {
    held->gate = nullptr;
  }
  counters_[ThreadSlot()].readers.fetch_sub(1, std::memory_order_seq_cst);
}

void SharedGate::AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  new (&writers_) Mutex;
  writer_.store(false, std::memory_order_relaxed);
  for (Counter& c : counters_) c.readers.store(0, std::memory_order_relaxed);
}

}  // namespace vmmshim

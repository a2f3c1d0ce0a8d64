#include "core/shared_gate.h"

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

void SharedGate::ReaderLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::atomic<int>& mine = counters_[ThreadSlot()].readers;
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
  counters_[ThreadSlot()].readers.fetch_sub(1, std::memory_order_seq_cst);
}

void SharedGate::AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  new (&writers_) Mutex;
  writer_.store(false, std::memory_order_relaxed);
  for (Counter& c : counters_) c.readers.store(0, std::memory_order_relaxed);
}

}  // namespace vmmshim

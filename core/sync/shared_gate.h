// A reader/writer lock for a hot read side: readers (every free, every
// stream-ordered call) touch only their thread slot's counter, each on a
// cache line of its own; a writer (a stream capture beginning or ending,
// rare) raises a flag and waits for every counter to drain.
//
// Why: the capture gate (core/sync/capture.h) is taken shared by every free so
// that no capture begins between a free's capture check and its
// synchronize. As one absl::Mutex, every reader's lock and unlock were
// read-modify-writes of one shared word, which more than doubled the cost
// of a free when eight threads freed (docs/performance.md, "Measurements behind the design": "The capture gate").
//
// Rule (Dekker's, sequentially consistent atomics on both sides): a reader
// increments its counter, then checks the flag; a writer sets the flag,
// then checks the counters. One of the two sees the other, so a reader
// never runs while a writer holds the gate; a reader that sees the flag
// backs off and waits for the writer.
// Writers are serialized by a mutex and take precedence (a reader waits
// while the flag is up). A thread may nest read locks of a gate (it keeps
// its depth per gate, for up to 4 gates at once, so a nested read lock does
// not wait for a writer that waits for the outer one; beyond 4 gates held,
// nesting is not supported), but must not take the write lock while
// holding a read lock (it would wait for itself).
// Thread safety: any thread. After fork(), the child calls AfterForkChild
// (the parent's readers do not exist there).
#ifndef VMMSHIM_CORE_SYNC_SHARED_GATE_H_
#define VMMSHIM_CORE_SYNC_SHARED_GATE_H_

#include <array>
#include <atomic>

#include "absl/base/thread_annotations.h"
#include "core/sync/mutex.h"
#include "core/sync/thread_slot.h"

namespace vmmshim {

class ABSL_LOCKABLE SharedGate {
 public:
  SharedGate() = default;
  SharedGate(const SharedGate&) = delete;
  SharedGate& operator=(const SharedGate&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION();
  void Unlock() ABSL_UNLOCK_FUNCTION();
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION();
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION();

  void AfterForkChild();

 private:
  struct alignas(64) Counter {
    std::atomic<int> readers{0};
  };
  Mutex writers_;                      // one writer at a time
  alignas(64) std::atomic<bool> writer_{false};
  std::array<Counter, kThreadSlots> counters_{};
};

class ABSL_SCOPED_LOCKABLE GateReaderLock {
 public:
  explicit GateReaderLock(SharedGate* gate) ABSL_SHARED_LOCK_FUNCTION(gate) : gate_(gate) {
    gate_->ReaderLock();
  }
  ~GateReaderLock() ABSL_UNLOCK_FUNCTION() { gate_->ReaderUnlock(); }
  GateReaderLock(const GateReaderLock&) = delete;
  GateReaderLock& operator=(const GateReaderLock&) = delete;

 private:
  SharedGate* const gate_;
};

class ABSL_SCOPED_LOCKABLE GateWriterLock {
 public:
  explicit GateWriterLock(SharedGate* gate) ABSL_EXCLUSIVE_LOCK_FUNCTION(gate) : gate_(gate) {
    gate_->Lock();
  }
  ~GateWriterLock() ABSL_UNLOCK_FUNCTION() { gate_->Unlock(); }
  GateWriterLock(const GateWriterLock&) = delete;
  GateWriterLock& operator=(const GateWriterLock&) = delete;

 private:
  SharedGate* const gate_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SYNC_SHARED_GATE_H_

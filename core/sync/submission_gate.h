// The submission gate: holds back the program's new GPU work while the shim
// pauses memory the program is not in control of (a deep sleep from outside,
// a pause called while other threads launch), and tells when the calls
// already inside the driver have returned. interpose/ passes every entry
// point of core/driver/work_submission.h through it; core/sleep/ closes and
// opens it (WorkQuiescer).
//
// Open path (every launch, copy, memset, event record, ...): TryEnter and
// Exit cost one relaxed load of the gate's state and two plain stores to the
// calling thread's own record; no lock, no read-modify-write. Correctness is
// Dekker's rule made asymmetric: a submitting thread stores "inside entry
// N" in its record, then (compiler fence only) loads the state; Close stores
// the state, then issues a process-wide memory barrier (membarrier(2),
// MEMBARRIER_CMD_PRIVATE_EXPEDITED; where the kernel lacks it, an mprotect
// of a page, whose TLB shootdown serializes every CPU running the process,
// as .NET and folly do), then reads the records. Either the thread sees the
// gate closed, or Close sees the thread inside and waits for it
// (WaitForCallsInside).
//
// Who passes a closed gate: the thread that closed it (it pauses, and may
// launch its own work meanwhile), and a thread inside an ExemptScope (a
// host function the driver runs for a stream, which the quiesce's
// synchronize waits for). Every other thread steps back out (its record
// says "not inside") and waits in WaitWhileClosed until Open.
//
// Thread records: one per thread that ever called TryEnter, made on its
// first call (an allocation: a thread's first gated call from a signal
// handler is not async-signal-safe, as the driver's is not), given back at
// the thread's exit for a later thread and never freed (Close reads them
// without a lock). A signal handler that submits work on a thread already
// inside nests (TryEnter returns the previous state in the ticket and Exit
// puts it back); one on a waiting thread waits too.
//
// Thread safety: TryEnter, Exit and WaitWhileClosed from any thread;
// Close/Open/WaitForCallsInside from one closing thread at a time
// (serialized by the caller: core/sleep/work_quiescer.h).
// Fork: AfterForkChild opens the gate in the child, where the closing
// thread does not exist, and forgets every other thread's record.
// Process exit: nothing to do; a thread waiting here is ended with the
// process.
#ifndef VMMSHIM_CORE_SYNC_SUBMISSION_GATE_H_
#define VMMSHIM_CORE_SYNC_SUBMISSION_GATE_H_

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "core/base/tls.h"

namespace vmmshim {

class SubmissionGate {
 public:
  // A thread's record: which gated entry point it is inside (0: none).
  struct alignas(64) ThreadRecord {
    std::atomic<uint32_t> inside{0};
    std::atomic<int> exempt{0};  // ExemptScope depth
    std::atomic<bool> in_use{false};
    std::atomic<pid_t> tid{0};
    // This claim's number (0: free): the closer is a claim, not a record, so
    // that a thread given the record of an exited closer is not the closer.
    std::atomic<uint64_t> claim{0};
    ThreadRecord* next = nullptr;  // the registry's list; set once
  };
  // What TryEnter saw, for Exit.
  struct Ticket {
    ThreadRecord* record;
    uint32_t previous;
  };
  // A call still inside the driver when WaitForCallsInside gave up.
  struct Inside {
    pid_t tid;
    uint32_t entry;
  };

  SubmissionGate();
  SubmissionGate(const SubmissionGate&) = delete;
  SubmissionGate& operator=(const SubmissionGate&) = delete;

  // The open path. `entry` (> 0) names the gated entry point (its index in
  // the caller's list, plus one). True: the caller may submit, and calls
  // Exit(*ticket) when the driver returns. False: the gate is closed to this
  // thread; it is not inside, and calls WaitWhileClosed before trying again.
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool TryEnter(uint32_t entry, Ticket* ticket) {
    ThreadRecord* record = t_record_;
    if (ABSL_PREDICT_FALSE(record == nullptr)) record = ClaimRecord();
    ticket->record = record;
    ticket->previous = record->inside.load(std::memory_order_relaxed);
    record->inside.store(entry, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the light side (header)
    if (ABSL_PREDICT_TRUE(state_.load(std::memory_order_relaxed) == kOpen)) return true;
    return EnterClosed(ticket);
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Exit(const Ticket& ticket) {
    ticket.record->inside.store(ticket.previous, std::memory_order_release);
  }
  // Blocks while the gate is closed to this thread, at most `limit`: true
  // once it may pass, false when `limit` ran out first (the caller says so
  // and waits again). On a futex: no lock is taken, so a signal handler on a
  // waiting thread may wait too.
  bool WaitWhileClosed(
      std::chrono::steady_clock::duration limit = std::chrono::steady_clock::duration::max());

  // Closes the gate: from now on every thread but this one (and exempt
  // ones) waits at TryEnter. Returns at once; calls already inside the
  // driver may still be there (WaitForCallsInside).
  void Close();
  // Waits until no thread but this one is inside a gated entry point, or
  // until `deadline`: empty then, else the calls still inside.
  std::vector<Inside> WaitForCallsInside(std::chrono::steady_clock::time_point deadline);
  // Opens the gate and wakes every waiting thread. Any thread may open it.
  void Open();
  bool closed() const { return state_.load(std::memory_order_acquire) != kOpen; }

  // How many times an exempt thread passed the closed gate (a host function
  // that submitted work during a quiesce: the quiesce synchronizes again).
  uint64_t exempt_passes() const { return exempt_passes_.load(std::memory_order_acquire); }
  // Threads waiting in WaitWhileClosed now.
  int waiting() const { return waiting_.load(std::memory_order_acquire); }

  // While alive, the calling thread passes a closed gate (any gate: the
  // mark is on the thread's record).
  class ExemptScope {
   public:
    ExemptScope();
    ~ExemptScope();
    ExemptScope(const ExemptScope&) = delete;
    ExemptScope& operator=(const ExemptScope&) = delete;

   private:
    ThreadRecord* record_;
  };

  void AfterForkChild();

 private:
  static constexpr uint32_t kOpen = 0;
  static constexpr uint32_t kClosed = 1;

  bool EnterClosed(Ticket* ticket);
  bool IsCloser(const ThreadRecord* record) const;
  static ThreadRecord* ClaimRecord();
  // A thread's record back to the registry, at the thread's exit.
  static void ReleaseRecord(ThreadRecord* record);
  // The key whose destructor calls ReleaseRecord.
  static pthread_key_t RecordKey();
  static ThreadRecord* ThisThreadRecord();

  // Constant-initialized and defined here, so that the open path reads it
  // with one %fs-relative load and no initialization check.
  VMMSHIM_INITIAL_EXEC_TLS static inline thread_local ThreadRecord* t_record_ = nullptr;

  alignas(64) std::atomic<uint32_t> state_{kOpen};
  std::atomic<uint64_t> closer_{0};  // the closing thread's claim; 0: none
  std::atomic<uint64_t> exempt_passes_{0};
  std::atomic<int> waiting_{0};
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SYNC_SUBMISSION_GATE_H_

#include "core/sync/submission_gate.h"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <ctime>
#include <thread>

namespace vmmshim {
namespace {

// Every record ever made, newest first; records are never freed.
std::atomic<SubmissionGate::ThreadRecord*> g_records{nullptr};
// Claims are numbered: a record handed to a later thread is another claim.
std::atomic<uint64_t> g_claims{0};

long Membarrier(int cmd) { return syscall(__NR_membarrier, cmd, 0, 0); }

// The heavy side of the asymmetric fence (header comment): the process's
// expedited membarrier; else the global one (slower: it waits for every
// CPU's next context switch); else, on x86-64, an mprotect of a page this
// process wrote, whose TLB shootdown interrupts every CPU running the
// process. Without any of them (aarch64 before Linux 4.3) only this
// thread's fence remains, and the order is not guaranteed.
class ProcessBarrier {
 public:
  ProcessBarrier() {
    expedited_ = Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
    const long supported = Membarrier(MEMBARRIER_CMD_QUERY);
    global_ = supported > 0 && (supported & MEMBARRIER_CMD_GLOBAL) != 0;
  }
  void Run() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (expedited_ && Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
    if (global_ && Membarrier(MEMBARRIER_CMD_GLOBAL) == 0) return;
#if defined(__x86_64__)
    if (page_ == nullptr) {
      void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      page_ = p == MAP_FAILED ? nullptr : p;
    }
    if (page_ != nullptr) {
      static_cast<volatile char*>(page_)[0] = 1;
      mprotect(page_, 4096, PROT_READ);
      mprotect(page_, 4096, PROT_READ | PROT_WRITE);
    }
#endif
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

 private:
  bool expedited_ = false;
  bool global_ = false;
  void* page_ = nullptr;  // written by the closing thread only (Close is serialized)
};

ProcessBarrier& Barrier() {
  static ProcessBarrier* barrier = new ProcessBarrier;
  return *barrier;
}

}  // namespace

// A thread's record goes back when the thread exits: from a pthread key's
// destructor, which runs after the C++ thread_local destructors (a gated
// call from one of those still finds its record), and forgets it, so that a
// call from a later key destructor claims a record of its own.
pthread_key_t SubmissionGate::RecordKey() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    pthread_key_create(&k, [](void* r) {
      auto* record = static_cast<SubmissionGate::ThreadRecord*>(r);
      SubmissionGate::ReleaseRecord(record);
    });
    return k;
  }();
  return key;
}

void SubmissionGate::ReleaseRecord(ThreadRecord* record) {
  record->inside.store(0, std::memory_order_relaxed);
  record->exempt.store(0, std::memory_order_relaxed);
  record->claim.store(0, std::memory_order_release);
  if (t_record_ == record) t_record_ = nullptr;
  record->in_use.store(false, std::memory_order_release);
}

SubmissionGate::SubmissionGate() { Barrier(); }  // registered before any Close

SubmissionGate::ThreadRecord* SubmissionGate::ClaimRecord() {
  ThreadRecord* record = nullptr;
  for (ThreadRecord* r = g_records.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    bool expected = false;
    if (!r->in_use.load(std::memory_order_relaxed) &&
        r->in_use.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      record = r;
      break;
    }
  }
  if (record == nullptr) {
    record = new ThreadRecord;
    record->in_use.store(true, std::memory_order_relaxed);
    ThreadRecord* head = g_records.load(std::memory_order_relaxed);
    do {
      record->next = head;
    } while (!g_records.compare_exchange_weak(head, record, std::memory_order_release,
                                              std::memory_order_relaxed));
  }
  record->tid.store(static_cast<pid_t>(syscall(SYS_gettid)), std::memory_order_relaxed);
  record->claim.store(g_claims.fetch_add(1, std::memory_order_relaxed) + 1,
                      std::memory_order_release);
  t_record_ = record;
  pthread_setspecific(RecordKey(), record);
  return record;
}

SubmissionGate::ThreadRecord* SubmissionGate::ThisThreadRecord() {
  ThreadRecord* record = t_record_;
  return record != nullptr ? record : ClaimRecord();
}

bool SubmissionGate::IsCloser(const ThreadRecord* record) const {
  const uint64_t claim = record->claim.load(std::memory_order_acquire);
  return claim != 0 && closer_.load(std::memory_order_acquire) == claim;
}

bool SubmissionGate::EnterClosed(Ticket* ticket) {
  ThreadRecord* record = ticket->record;
  if (IsCloser(record)) return true;
  if (record->exempt.load(std::memory_order_relaxed) > 0) {
    exempt_passes_.fetch_add(1, std::memory_order_acq_rel);
    return true;
  }
  // Not inside after all: the closer may be waiting for this record.
  record->inside.store(ticket->previous, std::memory_order_release);
  return false;
}

bool SubmissionGate::WaitWhileClosed(std::chrono::steady_clock::duration limit) {
  ThreadRecord* record = ThisThreadRecord();
  waiting_.fetch_add(1, std::memory_order_acq_rel);
  // A futex on the state word: no lock, so a signal handler that submits
  // work on a waiting thread waits again instead of deadlocking. The
  // timeout re-checks who may pass (a record may have become exempt).
  const timespec tick = {0, 100 * 1000 * 1000};
  const auto start = std::chrono::steady_clock::now();
  bool open = false;
  while (!(open = state_.load(std::memory_order_acquire) == kOpen) && !IsCloser(record) &&
         record->exempt.load(std::memory_order_relaxed) == 0 &&
         std::chrono::steady_clock::now() - start < limit) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&state_), FUTEX_WAIT_PRIVATE, kClosed, &tick,
            nullptr, 0);
  }
  waiting_.fetch_sub(1, std::memory_order_acq_rel);
  return open || IsCloser(record) || record->exempt.load(std::memory_order_relaxed) > 0;
}

void SubmissionGate::Close() {
  closer_.store(ThisThreadRecord()->claim.load(std::memory_order_relaxed),
                std::memory_order_release);
  state_.store(kClosed, std::memory_order_seq_cst);
  Barrier().Run();
}

std::vector<SubmissionGate::Inside> SubmissionGate::WaitForCallsInside(
    std::chrono::steady_clock::time_point deadline) {
  const ThreadRecord* self = ThisThreadRecord();
  auto pause = std::chrono::microseconds(1);
  while (true) {
    std::vector<Inside> inside;
    for (ThreadRecord* r = g_records.load(std::memory_order_acquire); r != nullptr; r = r->next) {
      if (r == self || r->exempt.load(std::memory_order_relaxed) > 0) continue;
      const uint32_t entry = r->inside.load(std::memory_order_acquire);
      if (entry != 0) inside.push_back({r->tid.load(std::memory_order_relaxed), entry});
    }
    if (inside.empty() || std::chrono::steady_clock::now() >= deadline) return inside;
    // A call inside the driver lasts microseconds (a launch) to the length
    // of the work queued before it (a synchronous copy): back off to 1 ms.
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

void SubmissionGate::Open() {
  closer_.store(0, std::memory_order_release);
  state_.store(kOpen, std::memory_order_seq_cst);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
}

SubmissionGate::ExemptScope::ExemptScope() : record_(ThisThreadRecord()) {
  record_->exempt.fetch_add(1, std::memory_order_acq_rel);
}

SubmissionGate::ExemptScope::~ExemptScope() {
  record_->exempt.fetch_sub(1, std::memory_order_acq_rel);
}

void SubmissionGate::AfterForkChild() {
  // Only the forking thread exists: every other record is free again.
  ThreadRecord* self = t_record_;
  for (ThreadRecord* r = g_records.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    if (r == self) continue;
    r->inside.store(0, std::memory_order_relaxed);
    r->exempt.store(0, std::memory_order_relaxed);
    r->claim.store(0, std::memory_order_relaxed);
    r->in_use.store(false, std::memory_order_relaxed);
  }
  if (self != nullptr) self->tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
  waiting_.store(0, std::memory_order_relaxed);
  closer_.store(0, std::memory_order_relaxed);
  state_.store(kOpen, std::memory_order_relaxed);
}

}  // namespace vmmshim

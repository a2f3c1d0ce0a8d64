// The mutex type of vmmshim's own locks: absl::Mutex, except in
// ThreadSanitizer builds (VMMSHIM_TSAN, set by -DVMMSHIM_SANITIZE=thread),
// where it is a std::shared_mutex with the same interface subset and the
// same thread-safety annotations; CondVar likewise (absl::CondVar, or a
// std::condition_variable_any over that mutex).
//
// Why: the project's abseil (tools/build/build-abseil.sh) is not built with
// -fsanitize=thread, so TSan cannot
// see absl::Mutex's synchronization (futex calls inside an uninstrumented
// library) and would report every access guarded by one as a race. TSan
// intercepts std::shared_mutex (pthread_rwlock), so in its build the reports
// are about our code only. Everything else is identical in both builds.
//
// Thread safety: as absl::Mutex (exclusive and shared locking, not
// recursive). After fork(), a child re-creates a mutex in place with
// `new (&mu) Mutex` (core/shim_core.h, PrepareFork, explains why).
#ifndef VMMSHIM_CORE_SYNC_MUTEX_H_
#define VMMSHIM_CORE_SYNC_MUTEX_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#if defined(VMMSHIM_TSAN)
#include <condition_variable>
#include <shared_mutex>
#endif

namespace vmmshim {

#if defined(VMMSHIM_TSAN)

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// absl::CondVar's subset: Wait(mu) and WaitWithTimeout(mu, timeout) with
// `mu` held exclusively, SignalAll.
class CondVar {
 public:
  void Wait(Mutex* mu) {
    Lockable lockable{mu};
    cv_.wait(lockable);
  }
  // Returns true when the timeout passed (absl::CondVar's meaning).
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
    Lockable lockable{mu};
    return cv_.wait_for(lockable, absl::ToChronoNanoseconds(timeout)) == std::cv_status::timeout;
  }
  void SignalAll() { cv_.notify_all(); }

 private:
  struct Lockable {  // BasicLockable over our Mutex
    Mutex* mu;
    void lock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu->Lock(); }
    void unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu->Unlock(); }
  };
  std::condition_variable_any cv_;
};

#else

using Mutex = absl::Mutex;
using MutexLock = absl::MutexLock;
using ReaderMutexLock = absl::ReaderMutexLock;
using CondVar = absl::CondVar;

#endif

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SYNC_MUTEX_H_

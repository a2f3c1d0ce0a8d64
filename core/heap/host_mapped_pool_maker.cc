// HostMappedPool's background maker (Options::make_in_background,
// core/heap/host_mapped_pool.h): what a Take queued, made one allocation at a
// time off the pause's path, quiet while a pause or resume runs.
#include "core/heap/host_mapped_pool.h"
#include <algorithm>
#include <atomic>
#include <new>
#include <system_error>
#include <utility>
#include "absl/strings/str_cat.h"
#include "core/base/host_memory.h"
#include "core/base/log.h"
#include "core/driver/cu_status.h"
#include "core/driver/vmm_mapping.h"

namespace vmmshim {

void HostMappedPool::SetQuiet(bool quiet) {
  MutexLock lock(&mu_);
  quiet_ = quiet;
  claimed_.clear();  // Note [A pause's memories share the queue]: a period starts or ends
  changed_.SignalAll();
}

bool HostMappedPool::AwaitMade(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  while (!stopping_ && (making_ || !queued_.empty())) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    changed_.WaitWithTimeout(&mu_, left);
  }
  return stopping_ || (!making_ && queued_.empty());
}

bool HostMappedPool::GiveWayLocked(const HostMemoryHeadroom& headroom,
                                   std::multimap<size_t, HostMappedMemory>* going) {
  size_t released = 0;
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (queued_.count(it->first) > 0) {
      ++it;
      continue;
    }
    released += it->first;
    going->insert(kept_.extract(it++));
  }
  if (released == 0) return false;
  kept_bytes_ -= released;
  figures_.trimmed_bytes += released;
  figures_.limited_by = headroom.limited_by;
  Log().info("device {}: {} bytes of host memory kept for paused contents of other sizes "
             "released in the background for {} bytes queued ({})",
             device_, released, queued_size_bytes(), headroom.limited_by);
  ++releasing_;
  return true;
}

void HostMappedPool::MakeQueued() {
  for (;;) {
    size_t size;
    // Kept memory of sizes nobody waits for, given way to what is queued:
    // released outside the lock, then the queue is looked at again.
    std::multimap<size_t, HostMappedMemory> going;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && (queued_.empty() || quiet_)) changed_.Wait(&mu_);
      if (stopping_) return;
      size = *queued_.begin();
      HostMemoryHeadroom headroom;
      if (!FitsLocked(size, &headroom) && !GiveWayLocked(headroom, &going)) {
        if (!background_logged_) {
          Log().info("device {}: host memory for paused contents: {} bytes not made in the "
                     "background: the pool would hold {} bytes with {} left ({})",
                     device_, queued_size_bytes(), kept_bytes_ + in_use_bytes_ + size,
                     headroom.bytes, headroom.limited_by);
          background_logged_ = true;
        }
        figures_.limited_by = headroom.limited_by;
        queued_.clear();
        continue;
      }
      if (going.empty()) making_ = true;
    }
    if (!going.empty()) {
      ReleaseCounted(going);
      continue;
    }
    absl::StatusOr<HostMappedMemory> made = HostMappedMemory::Create(driver_, node_, device_, size);
    HostMappedMemory unwanted;  // Trim, Release or the destructor came meanwhile
    {
      MutexLock lock(&mu_);
      auto it = queued_.find(size);
      if (!made.ok()) {
        if (!background_logged_) {
          Log().warn("device {}: host memory for paused contents: making {} bytes in the "
                     "background: {}; pauses keep those contents in other host memory",
                     device_, queued_size_bytes(), made.status().ToString());
          background_logged_ = true;
        }
        queued_.clear();
      } else if (it != queued_.end() && !stopping_) {
        queued_.erase(it);
        figures_.background_bytes += size;
        KeepLocked(*std::move(made));
      } else {
        unwanted = *std::move(made);
      }
    }
    // Released outside the lock, and before making_ clears: a Release
    // waiting for it finds no host memory left (Note [The driver's
    // checkpoint and host VMM memory]).
    { HostMappedMemory going = std::move(unwanted); }
    MutexLock lock(&mu_);
    making_ = false;
    changed_.SignalAll();
  }
}

}  // namespace vmmshim

#include "core/shim_core.h"

#include <utility>

#include "core/base/cpus.h"
#include "core/base/log.h"
#include "core/driver/context.h"
#include "core/sync/thread_slot.h"

namespace vmmshim {

ShimCore::ShimCore(const DriverApi& driver, AllocatorOptions options)
    : driver_(driver),
      options_(std::move(options)),
      mapper_(driver),
      captures_(driver),
      free_syncs_([this](CUcontext c) { return SynchronizeContext(driver_, c); }),
      heaps_(driver, mapper_, options_),
      stream_ordered_(driver, heaps_, captures_, options_.peer_policy,
                      options_.stream_query_interval_ns),
      peers_(driver, heaps_, options_.history),
      foreign_(driver),
      pause_(driver, heaps_, captures_,
             options_.copy_threads > 0 ? options_.copy_threads : UsableCpusUpTo(16),
             {options_.pinned_pool_bytes, options_.pinned_pool_chunk_bytes}, &foreign_,
             {options_.paused_memory_addressable, options_.host_pool_idle_seconds,
              options_.host_memory_in_background, options_.host_pool_max_bytes}),
      allocator_(driver, options_, heaps_, captures_, free_syncs_, stream_ordered_,
                 memory_margin_bytes_),
      control_(MemoryControl::Rooms{driver, options_, heaps_, captures_, free_syncs_,
                                    stream_ordered_, pause_, foreign_, counters_,
                                    peer_enables_, memory_margin_bytes_}) {
  // The rooms above register with those below, in the order their state
  // must exist: a device's stream-ordered cache before the pinned pool.
  heaps_.AddListener(&stream_ordered_);
  heaps_.AddListener(&pause_);
  pause_.AddParticipant(&stream_ordered_);
  // Another core (tests) may see the same context handles on other
  // devices.
  ForgetContexts();
}

ShimCore::~ShimCore() {
  absl::Status status = ReleaseAll();
  if (!status.ok()) Log().warn("releasing at teardown: {}", status.ToString());
}

void ShimCore::PrepareFork() {
  captures_.PrepareForkGate();
  pause_.PrepareFork();
  foreign_.PrepareFork();
  heaps_.PrepareForkPeers();
  stream_ordered_.PrepareFork();
  heaps_.PrepareForkHeaps();
  captures_.PrepareForkState();
  pause_.PrepareForkHostPools();
}

void ShimCore::AfterFork(bool in_child) {
  if (in_child) {
    // Unlocking would try to wake the parent's threads that were queued on
    // a mutex (they do not exist here) and spin forever: the child, alone,
    // gets fresh, unlocked mutexes instead.
    captures_.AfterForkChild();
    free_syncs_.AfterForkChild();
    ResetThreadSlotsInForkChild();  // the parent's other threads do not exist here
    heaps_.AfterForkChild();
    stream_ordered_.AfterForkChild();
    foreign_.AfterForkChild();
    pause_.AfterForkChild();
    return;
  }
  pause_.AfterForkParentHostPools();
  captures_.AfterForkParentState();
  heaps_.AfterForkParentHeaps();
  stream_ordered_.AfterForkParent();
  heaps_.AfterForkParentPeers();
  foreign_.AfterForkParent();
  pause_.AfterForkParent();
  captures_.AfterForkParentGate();
}

absl::Status ShimCore::ReleaseAll() {
  absl::Status status = heaps_.ReleaseAll();
  foreign_.DropBackups();  // from pools pause_ owns, which go before foreign_
  pause_.ReleaseHostMemory();  // after the heaps: their paused blocks gave theirs back
  return status;
}

}  // namespace vmmshim

// The host memory that paused allocations stay addressable through
// (docs/pause-resume-design.md, "Paused memory stays addressable"), one
// pool per device: host VMM memory (core/heap/host_mapped_memory.h) at the
// device's host NUMA node.
//
// Why a pool: making pinned host memory is several times slower than the
// copy engine fills it (docs/performance.md, "Measurements behind the
// design": "Pinning host memory"), so a pause that had to make its host
// memory runs at the pinning's speed. The memory a resume frees is kept,
// by size, for the next pause: a loop that pauses and resumes the same set
// (an RL step) makes host memory once, by its first pause or in the
// background after it (Options::make_in_background), and copies at the
// copy engine's speed from then on. Sized to the work: what the process
// paused last, under Options::max_bytes where that is set.
//
// Limits: what the pool keeps is page-locked host memory, never reclaimed
// by the kernel; it keeps memory only while it holds at most 3/4 of what it
// holds plus the host memory left (core/base/host_memory.h: MemAvailable or
// the memory cgroup's headroom), and releases the rest, logged once naming
// the limit. Kept memory unused for `idle_seconds` is released (a pool
// trimmed so makes it again at the next pause).
//
// Dropped contents: a pause without contents maps scratch host memory
// read-write over the whole range (virtual aliasing, guide section
// 4.16.5.3), so that a stray access reads and writes undefined data instead
// of faulting. The scratch is two handles made once per pool and kept: one
// of kLargeScratchBytes, mapped again and again over the range's largest
// multiple of it, and one granule over the rest (a handle is mapped whole:
// host memory refuses a part of a handle, CUDA_ERROR_NOT_SUPPORTED on the
// H100), so that a range takes one cuMemMap per 64 MiB rather than per
// granule (each call costs tens of microseconds: docs/performance.md,
// "Paused memory stays addressable").
//
// Note [The maker keeps quiet]: making host memory pins it, and on an H100
// a pause or resume that ran beside the background maker ran several times
// slower than one without it (a 16 GiB resume: 5.0 s against 0.93 s with no
// host memory made; docs/data/addressable-pause-h100.log), the maker's
// cuMemCreate holding up the pause's own driver calls. So the coordinator
// keeps the pools quiet while a pause or resume runs (HostMappedPools::
// SetQuiet): the maker starts nothing new then, and goes on after it.
//
// Note [A pause's memories share the queue]: in the background (Options::
// make_in_background) a pause asks the pool once per memory that pauses on
// the device (each heap arena, other libraries' VMM memory), and what is
// queued already counts, so that a pause that comes before the maker is done
// with an earlier one's queue queues nothing twice. Within one pause (a quiet
// period), though, entries one memory counted on are its own: the next one
// that needs the same size queues its own. Else one of them waits for
// memory that is never made, its contents faulting until the resume (on an
// H100, 50 MiB of the defaults' first pause in examples/paused_access.py
// still faulted after 120 s).
//
// Note [The driver's checkpoint and host VMM memory]: on driver 580 (H100,
// docs/data/addressable-pause-h100.log) the driver's process checkpoint of a
// process holding host VMM memory succeeds and its restore fails with
// CUDA_ERROR_UNKNOWN, the process left locked for good, even for one 2 MiB
// granule. A deep sleep therefore releases all of it, the scratch included,
// and refuses while any is still taken (PauseCoordinator::
// ReleaseHostMemoryForCheckpoint).
//
// Units: bytes, multiples of the node's granularity.
//
// Thread safety: every member may be called from any thread.
//
// At destruction the pool's threads are joined and the memory released.
// The preloaded shim never destroys its core; at process exit it calls
// ReleaseForGood before the driver's teardown (interpose/runtime.cc), and
// host memory still mapped at paused addresses goes with the process. A
// fork's child forgets the parent's (AfterForkChild).
#ifndef VMMSHIM_CORE_HEAP_HOST_MAPPED_POOL_H_
#define VMMSHIM_CORE_HEAP_HOST_MAPPED_POOL_H_

#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/host_memory.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"
#include "core/driver/vmm_mapping.h"
#include "core/heap/host_mapped_memory.h"
#include "core/sync/mutex.h"

namespace vmmshim {

// What a paused range maps while it is paused (docs/pause-resume.md,
// "Touching paused memory").
enum class PausedView : uint8_t {
  kNothing,   // an access faults (VMMSHIM_PAUSED_ACCESS=fault, or no host VMM memory)
  kContents,  // its backup's host VMM memory: reads and writes reach the kept contents
  kScratch,   // the device's scratch handles, again and again: undefined data
};

// A paused range's view, as HostMappedPool::MapView mapped it: its kind, the
// bytes each of its mappings covers, and how much of it an unmap that
// failed midway took away already. Shared by the shim's blocks
// (core/heap/arena_blocks.h) and other libraries' mappings
// (core/foreign/foreign_vmm.h).
class HostMappedPool;

struct ViewMapping {
  PausedView kind = PausedView::kNothing;
  // The bytes each mapping covers: [0, head_bytes) in pieces of
  // `head_piece`, the rest in pieces of `piece` (kContents: one piece).
  size_t piece = 0;
  size_t head_bytes = 0;
  size_t head_piece = 0;
  size_t unmapped = 0;  // from the start, what a failed Unmap left done
  // kScratch: the pool whose scratch it maps, which counts such views until
  // they are unmapped (Stats::scratch_views).
  HostMappedPool* scratch_of = nullptr;

  bool mapped() const { return kind != PausedView::kNothing; }
  // Unmaps it from [va, va + size): one cuMemUnmap, else piece by piece
  // (VmmMapper::UnmapRepeated), resuming where a failed try stopped; empty
  // (kNothing) on success. Nothing to do when not mapped.
  absl::Status Unmap(const VmmMapper& mapper, CUdeviceptr va, size_t size);
};

class HostMappedPool {
 public:
  // The larger scratch handle (rounded up to the node's granularity).
  static constexpr size_t kLargeScratchBytes = size_t{64} << 20;

  struct Options {
    // Kept memory unused this long is released; 0: kept until exit.
    double idle_seconds = 300;
    // Threads that make host memory at a pause (the copy threads' number).
    int threads = 1;
    // VMMSHIM_HOST_POOL_MAKE=background: a Take makes nothing on the
    // pause's path; what it lacks is made by one thread of the pool's in
    // the background and kept, for the next pause of those sizes.
    bool make_in_background = false;
    // The most the pool holds (kept, in use and being made; the scratch
    // apart); 0: the host's headroom alone (VMMSHIM_HOST_POOL_MAX).
    size_t max_bytes = 0;
    // Where the host's headroom is read (HostMemoryHeadroomUnder): "" is
    // this machine; tests plant a /proc and a /sys/fs/cgroup of their own.
    std::string headroom_root;
  };
  // `driver` must outlive the pool.
  HostMappedPool(const DriverApi& driver, int device, HostNode node, Options options);
  ~HostMappedPool();
  HostMappedPool(const HostMappedPool&) = delete;
  HostMappedPool& operator=(const HostMappedPool&) = delete;

  const HostNode& node() const { return node_; }
  int device() const { return device_; }

  // Host memory of each of `sizes`: kept memory of exactly that size, the
  // rest made now by up to Options::threads threads (kept memory of other
  // sizes is released first when the host's headroom would not hold what
  // is to be made). An entry the driver refused holds its error
  // (CUDA_ERROR_OUT_OF_MEMORY: host memory); one past Options::max_bytes,
  // kOutOfRange (nothing made for it). With make_in_background, the
  // rest is queued instead (once per size missing, counting what is
  // queued already) and its entries hold kUnavailable.
  std::vector<absl::StatusOr<HostMappedMemory>> Take(const std::vector<size_t>& sizes);
  // Kept memory of exactly `size`, taken as Take takes it; kNotFound when
  // none is kept (nothing is made or queued for it). For contents a pause
  // kept elsewhere while their memory was made in the background (Note
  // [Views made late], core/heap/pause.h).
  absl::StatusOr<HostMappedMemory> TakeKept(size_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until nothing is queued or being made in the background, the pool
  // stops (ReleaseForGood, destruction) or `timeout` passes; whether nothing
  // more is to be made (false: the timeout passed first).
  bool AwaitMade(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Memory Take returned, kept for the next pause within the limits above.
  void Give(HostMappedMemory memory);
  // Note [The maker keeps quiet]: while `quiet`, the background maker starts
  // no new allocation (one under way finishes).
  void SetQuiet(bool quiet) ABSL_LOCKS_EXCLUDED(mu_);

  // Maps the view of paused [va, va + size): `contents` (host VMM memory of
  // exactly `size`, this pool's) whole, else the scratch (MapScratch);
  // read-write for `access` and this pool's device, or for the device alone
  // where the driver refuses a peer's. The view, or the driver's error
  // (nothing mapped).
  absl::StatusOr<ViewMapping> MapView(CUdeviceptr va, size_t size,
                                      const HostMappedMemory* contents, DeviceSet access);

  // Every kept allocation released now, and nothing more made in the
  // background for what was queued; the bytes released.
  size_t Trim() ABSL_LOCKS_EXCLUDED(mu_);
  // Trim after the memory being made in the background is done (and
  // released), and the scratch too (a view still mapping it keeps its
  // memory until it is unmapped: guide 4.16.3); the bytes released.
  // Teardown, and a deep sleep's checkpoint (Note [The driver's checkpoint
  // and host VMM memory]).
  size_t Release() ABSL_LOCKS_EXCLUDED(mu_);
  // Release, and nothing made or trimmed by the pool's threads after it
  // (they end): the process's exit, before the driver's teardown.
  size_t ReleaseForGood() ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    size_t kept_bytes = 0;      // held for the next pause
    size_t in_use_bytes = 0;    // taken: holding paused contents now
    size_t scratch_bytes = 0;   // both scratch handles, as made
    size_t scratch_views = 0;   // views mapping the scratch now (each holds it: guide 4.16.3)
    size_t made_bytes = 0;      // made at pauses, over the process's life
    double make_seconds = 0;    // the time those pauses spent making it
    size_t reused_bytes = 0;    // taken from what was kept
    size_t trimmed_bytes = 0;   // released idle or over the limit
    size_t background_bytes = 0;  // made in the background (make_in_background), over its life
    size_t queued_bytes = 0;      // to be made in the background now
    std::string limited_by;     // the limit that last cut what is kept ("" none)
  };
  Stats stats() const;

  // A fork's child: the parent's memory means nothing to the driver there;
  // it is forgotten, now and as the child's paused blocks give it back.
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  friend class HostMappedPools;  // PrepareFork takes every pool's mutex
  friend struct ViewMapping;     // ScratchViewUnmapped
  void ScratchViewUnmapped() ABSL_LOCKS_EXCLUDED(mu_);
  // The scratch mapped over [va, va + size) with read-write access for
  // `access` (MapRepeated, core/driver/vmm_mapping.h): the large handle over
  // the largest multiple of its size, the granule over the rest; each is
  // made at the first range that needs it. The view's layout, or the
  // driver's error (nothing mapped).
  absl::StatusOr<ViewMapping> MapScratch(CUdeviceptr va, size_t size, DeviceSet access);
  // One scratch handle of `size`, made when `memory` is empty.
  absl::Status MakeScratchLocked(HostMappedMemory* memory, size_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Waits for the idle deadline and trims; ends at destruction.
  void TrimWhenIdle() ABSL_LOCKS_EXCLUDED(mu_);
  // make_in_background: makes what Take queued, one allocation at a time,
  // within the limits Give keeps to; ends at destruction.
  void MakeQueued() ABSL_LOCKS_EXCLUDED(mu_);
  // `memory` kept for the next pause when the limits above allow, else
  // released (logged once).
  void KeepLocked(HostMappedMemory memory) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `size` more bytes held by the pool stay within its limits (the
  // one that refused in `headroom`).
  bool FitsLocked(size_t size, HostMemoryHeadroom* headroom) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `size` more bytes would pass Options::max_bytes; what is left
  // under it, as a headroom naming the setting.
  bool OverMaxLocked(size_t size) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  HostMemoryHeadroom MaxAsHeadroomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The maker's give way: kept memory of sizes not queued moves to `going`
  // (counted in releasing_); false when there is none. `headroom`: why what
  // is queued did not fit (logged).
  bool GiveWayLocked(const HostMemoryHeadroom& headroom,
                     std::multimap<size_t, HostMappedMemory>* going)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases `going` outside the lock and counts one release of
  // releasing_ done (Release waits for them all).
  void ReleaseCounted(std::multimap<size_t, HostMappedMemory>& going) ABSL_LOCKS_EXCLUDED(mu_);
  size_t queued_size_bytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t sum = 0;
    for (size_t size : queued_) sum += size;
    return sum;
  }

  const DriverApi& driver_;
  const int device_;
  const HostNode node_;
  const Options options_;
  mutable Mutex mu_;
  CondVar changed_;  // a Take, a Give, the maker's progress or the destructor
  std::multimap<size_t, HostMappedMemory> kept_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t in_use_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  HostMappedMemory scratch_ ABSL_GUARDED_BY(mu_);        // one granule
  HostMappedMemory large_scratch_ ABSL_GUARDED_BY(mu_);  // kLargeScratchBytes
  size_t scratch_views_ ABSL_GUARDED_BY(mu_) = 0;
  Stats figures_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_use_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool in_fork_child_ ABSL_GUARDED_BY(mu_) = false;
  std::thread trimmer_;  // started at the first Give when idle_seconds > 0
  std::multiset<size_t> queued_ ABSL_GUARDED_BY(mu_);  // sizes to make in the background
  // Note [A pause's memories share the queue]: per size, the queued entries
  // a Take of this quiet period (one pause or resume: SetQuiet) counted on
  // already, which the next Take of the same period may not count on again.
  std::map<size_t, size_t> claimed_ ABSL_GUARDED_BY(mu_);
  bool making_ ABSL_GUARDED_BY(mu_) = false;  // the maker is making one (outside the lock)
  bool background_logged_ ABSL_GUARDED_BY(mu_) = false;  // a refusal logged once
  bool keep_logged_ ABSL_GUARDED_BY(mu_) = false;  // a keep refused, logged once
  bool quiet_ ABSL_GUARDED_BY(mu_) = false;        // SetQuiet
  // Releases of kept memory under way outside the lock (ReleaseCounted).
  int releasing_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread maker_;  // started at the first queued size
};

// The pools of every device, made on first use (HostMappedPools::For); what
// a pause's steps are handed to map paused memory (core/heap/pausable_memory.h).
class HostMappedPools {
 public:
  // `driver` must outlive the pools.
  HostMappedPools(const DriverApi& driver, HostMappedPool::Options options)
      : driver_(driver), options_(options) {}
  HostMappedPools(const HostMappedPools&) = delete;
  HostMappedPools& operator=(const HostMappedPools&) = delete;

  // `device`'s pool, made at the first call; nullptr where the device has no
  // host VMM memory (HostNode::Query), logged once.
  HostMappedPool* For(int device) ABSL_LOCKS_EXCLUDED(mu_);
  // Every pool made so far.
  std::vector<HostMappedPool*> All() const ABSL_LOCKS_EXCLUDED(mu_);
  // HostMappedPool::SetQuiet on every pool, and on those made while quiet.
  void SetQuiet(bool quiet) ABSL_LOCKS_EXCLUDED(mu_);
  // fork(): every mutex here (this one, then each pool's), taken last
  // (core/sync/lock_order.h: leaves) and released in reverse in the parent.
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  const DriverApi& driver_;
  const HostMappedPool::Options options_;
  mutable Mutex mu_;
  // device -> pool (nullptr: unsupported, asked once).
  std::map<int, std::unique_ptr<HostMappedPool>> pools_ ABSL_GUARDED_BY(mu_);
  bool quiet_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_HOST_MAPPED_POOL_H_

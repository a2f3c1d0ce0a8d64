// The heaps of every device and what they share: the table the allocator and
// the rooms above the heap (stream-ordered front end, pause) reach memory
// through.
//
// A device's heap (core/heap/device_heap.h) is created on its first use,
// after the device's VMM support, handle types, compression, granularity and
// total memory are read from the driver; a device without VMM support gets
// no heap (logged once) and its requests go to the driver. Every heap shares
// one ReservationMap (VA reservation -> device and arena, so the arena of a
// pointer is one lock-free lookup), one ExportRegistry, the process-wide
// counters and the peer-enable tables.
//
// Thread safety: any thread. Heaps are published with release stores and
// never destroyed before the table; HeapFor serializes creation only.
// Lock order: core/sync/lock_order.h (the peer mutex, then the heap creation
// mutex).
// Process exit: the shim never destroys its table (the driver may be gone);
// tests do, after ReleaseAll.
#ifndef VMMSHIM_CORE_HEAP_HEAP_TABLE_H_
#define VMMSHIM_CORE_HEAP_HEAP_TABLE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/device_set.h"
#include "core/driver/driver_api.h"
#include "core/driver/vmm_mapping.h"
#include "core/heap/allocator_options.h"
#include "core/heap/device_heap.h"
#include "core/heap/export_registry.h"
#include "core/heap/va_free_list.h"
#include "core/peer/peer_access.h"
#include "core/peer/policy/peer_policy.h"
#include "core/sync/capture.h"
#include "core/sync/mutex.h"

namespace vmmshim {

class HeapTable {
 public:
  // A room above the heaps that keeps state per device (the stream-ordered
  // caches, the pinned pool) registers one of these, before the first
  // HeapFor, instead of the heaps calling up into it (docs/architecture.md,
  // "Callbacks"). HeapCreated runs for a new heap's device, with the
  // device's context current, before the heap is published, under the
  // creation mutex: whoever sees the heap sees what the listeners made.
  class Listener {
   public:
    virtual void HeapCreated(int device) = 0;

   protected:
    ~Listener() = default;
  };

  // `driver`, `mapper` and `options` must outlive the table (ShimCore owns
  // them all); the peer policy is options.peer_policy.
  HeapTable(const DriverApi& driver, const VmmMapper& mapper, const AllocatorOptions& options);
  // Deletes the heaps (their memory must have been released: ReleaseAll).
  ~HeapTable();
  HeapTable(const HeapTable&) = delete;
  HeapTable& operator=(const HeapTable&) = delete;

  // `listener` (not owned; must outlive the table) hears of every heap
  // created from now on, after those registered before it.
  void AddListener(Listener* listener) ABSL_LOCKS_EXCLUDED(create_mu_);

  // The heap of `device`, created on first use; nullptr when the device has
  // no VMM support. InvalidArgument for an ordinal out of range; the
  // driver's error when a device attribute cannot be read.
  absl::StatusOr<DeviceHeap*> HeapFor(int device) ABSL_LOCKS_EXCLUDED(create_mu_);
  // The heap of `device` if it exists (no creation, no lock), else nullptr.
  DeviceHeap* heap(int device) const {
    return DeviceSet::IsOrdinal(device) ? heaps_[device].load(std::memory_order_acquire)
                                        : nullptr;
  }

  // The heap and arena whose VA holds `ptr` (one ReservationMap lookup);
  // both nullptr outside the shim's VA.
  struct Location {
    DeviceHeap* heap = nullptr;
    HeapArena* arena = nullptr;
  };
  Location Locate(CUdeviceptr ptr) const;

  // cuDeviceGetCount, asked once (at most kMaxDevices).
  absl::StatusOr<int> DeviceCount();

  // `fn(DeviceHeap*)` for every heap made so far, in device order.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const auto& slot : heaps_) {
      if (DeviceHeap* h = slot.load(std::memory_order_acquire)) fn(h);
    }
  }

  // Who enabled access to whose memory: by cuCtxEnablePeerAccess (peers)
  // and by cuMemPoolSetAccess on default pools (pool_peers). Changed only
  // under peer_mu(); Enabled() reads are lock-free.
  PeerEnableTable& peers() { return peers_; }
  PeerEnableTable& pool_peers() { return pool_peers_; }
  Mutex& peer_mu() ABSL_LOCK_RETURNED(peer_mu_) { return peer_mu_; }
  ExportRegistry& exports() { return exports_; }
  GlobalCounters& global() { return global_; }
  const GlobalCounters& global() const { return global_; }

  // Frees deferred by stream captures (HeapArena::DeferFree). After
  // `context` was synchronized: completes its deferred frees (no work when
  // none is deferred anywhere: one atomic load).
  void CompleteDeferred(CUcontext context);
  // Once no capture is in progress (asked again, with the capture gate held
  // shared): synchronizes the contexts with deferred frees and completes
  // them; true when any completed.
  bool ReclaimDeferred(CaptureTracker& captures);

  // Every heap's ReleaseAll (unmap -> release -> address free); the first
  // error, after trying all.
  absl::Status ReleaseAll();

  // fork(): the peer and creation mutexes, every heap, the reservation map
  // and the export registry, in lock order (core/sync/lock_order.h); the
  // child gets fresh mutexes.
  void PrepareForkPeers() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void PrepareForkHeaps() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkParentHeaps() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkParentPeers() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  const DriverApi& driver_;
  const VmmMapper& mapper_;
  const AllocatorOptions& options_;

  ReservationMap ranges_;
  ExportRegistry exports_;
  GlobalCounters global_;
  PeerEnableTable peers_, pool_peers_;
  Mutex peer_mu_;  // lock order: "peer mutex"
  Mutex create_mu_ ABSL_ACQUIRED_AFTER(peer_mu_);  // "heap creation mutex"
  std::vector<Listener*> listeners_ ABSL_GUARDED_BY(create_mu_);
  std::array<std::atomic<DeviceHeap*>, kMaxDevices> heaps_{};
  std::array<std::atomic<bool>, kMaxDevices> no_vmm_{};
  std::atomic<int> device_count_{0};
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_HEAP_TABLE_H_

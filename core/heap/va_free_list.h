// Bookkeeping of free virtual address space inside VA reservations.
//
// A VaFreeList knows which parts of the reservations it was given
// (cuMemAddressReserve ranges) are not in use. It never calls the driver:
// the owner reserves and frees the ranges. Every size and address it handles
// is a multiple of `alignment` (the device's allocation granularity, so any
// range it returns can be passed to cuMemMap). Free ranges are coalesced, but
// never across two reservations, because cuMemMap must map inside one
// reservation.
//
// Allocation is best fit (smallest free range that fits; lowest address on
// ties), so large reservations do not fragment under mixed sizes.
// Thread safety: none; the owner serializes calls.
#ifndef VMMSHIM_CORE_HEAP_VA_FREE_LIST_H_
#define VMMSHIM_CORE_HEAP_VA_FREE_LIST_H_

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "core/sync/mutex.h"
#include "absl/container/btree_set.h"

namespace vmmshim {

class VaFreeList {
 public:
  explicit VaFreeList(size_t alignment) : alignment_(alignment) {}

  // Adds a whole reservation [base, base + size) as free. `base` and `size`
  // must be multiples of alignment().
  void AddReservation(CUdeviceptr base, size_t size);

  // A free range of `size` bytes (a multiple of alignment()), or nullopt when
  // no free range is large enough (the owner then reserves more).
  std::optional<CUdeviceptr> Allocate(size_t size);

  // Returns [base, base + size) to the free space. It must have come from
  // Allocate with the same size.
  void Free(CUdeviceptr base, size_t size);

  // True when `ptr` lies in one of the reservations.
  bool Contains(CUdeviceptr ptr) const;
  // The base of the reservation holding `ptr` (which must be inside one).
  CUdeviceptr ReservationBase(CUdeviceptr ptr) const { return ReservationOf(ptr)->first; }

  size_t alignment() const { return alignment_; }
  size_t free_bytes() const { return free_bytes_; }
  size_t reserved_bytes() const { return reserved_bytes_; }
  const absl::btree_map<CUdeviceptr, size_t>& reservations() const { return reservations_; }

 private:
  // The reservation holding `ptr` (which must be inside one).
  absl::btree_map<CUdeviceptr, size_t>::const_iterator ReservationOf(CUdeviceptr ptr) const;
  void Insert(CUdeviceptr base, size_t size);
  void Erase(absl::btree_map<CUdeviceptr, size_t>::iterator it);

  size_t alignment_;
  size_t free_bytes_ = 0;
  size_t reserved_bytes_ = 0;
  absl::btree_map<CUdeviceptr, size_t> reservations_;             // base -> size
  absl::btree_map<CUdeviceptr, size_t> free_by_address_;          // base -> size
  absl::btree_set<std::pair<size_t, CUdeviceptr>> free_by_size_;  // (size, base)
};

// VA reservation base -> (size, device, arena), for finding the heap and
// the arena of a pointer on every free.
// Thread safety: lookups take no lock: writers (a new reservation, rare)
// publish a new sorted snapshot under the mutex, and earlier snapshots stay
// alive until the map is destroyed (a reader may still hold one), so memory
// grows by one small array per reservation change.
class ReservationMap {
 public:
  struct Owner {
    int device = -1;
    int arena = 0;
  };
  ReservationMap() = default;
  ~ReservationMap();
  ReservationMap(const ReservationMap&) = delete;
  ReservationMap& operator=(const ReservationMap&) = delete;

  void Add(CUdeviceptr base, size_t size, int device, int arena = 0) ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(CUdeviceptr base) ABSL_LOCKS_EXCLUDED(mu_);
  // The device and arena whose reservation holds `ptr`; device -1 if none.
  Owner Lookup(CUdeviceptr ptr) const;
  // The device whose reservation holds `ptr`, or -1.
  int DeviceOf(CUdeviceptr ptr) const { return Lookup(ptr).device; }
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  struct Entry {
    CUdeviceptr base;
    size_t size;
    Owner owner;
  };
  using Snapshot = std::vector<Entry>;  // sorted by base
  void PublishLocked(Snapshot next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;  // lock order: "reservation map mutex" (core/sync/lock_order.h)
  std::atomic<const Snapshot*> current_{nullptr};
  std::vector<std::unique_ptr<const Snapshot>> snapshots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_VA_FREE_LIST_H_

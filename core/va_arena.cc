#include "core/va_arena.h"

#include <new>

#include <iterator>

namespace vmmshim {

void VaArena::AddReservation(CUdeviceptr base, size_t size) {
  reservations_[base] = size;
  reserved_bytes_ += size;
  Insert(base, size);
}

std::optional<CUdeviceptr> VaArena::Allocate(size_t size) {
  auto it = free_by_size_.lower_bound({size, 0});
  if (it == free_by_size_.end()) return std::nullopt;
  const auto [range_size, base] = *it;
  Erase(free_by_address_.find(base));
  if (range_size > size) Insert(base + size, range_size - size);
  return base;
}

void VaArena::Free(CUdeviceptr base, size_t size) {
  auto reservation = ReservationOf(base);
  const CUdeviceptr lo = reservation->first;
  const CUdeviceptr hi = lo + reservation->second;
  // Coalesce with the neighbours inside the same reservation.
  auto next = free_by_address_.lower_bound(base);
  if (next != free_by_address_.end() && next->first == base + size && next->first < hi) {
    size += next->second;
    Erase(next);
  }
  auto prev = free_by_address_.lower_bound(base);
  if (prev != free_by_address_.begin()) {
    --prev;
    if (prev->first >= lo && prev->first + prev->second == base) {
      base = prev->first;
      size += prev->second;
      Erase(prev);
    }
  }
  Insert(base, size);
}

bool VaArena::Contains(CUdeviceptr ptr) const {
  auto it = reservations_.upper_bound(ptr);
  if (it == reservations_.begin()) return false;
  --it;
  return ptr < it->first + it->second;
}

absl::btree_map<CUdeviceptr, size_t>::const_iterator VaArena::ReservationOf(
    CUdeviceptr ptr) const {
  return std::prev(reservations_.upper_bound(ptr));
}

void VaArena::Insert(CUdeviceptr base, size_t size) {
  free_by_address_[base] = size;
  free_by_size_.insert({size, base});
  free_bytes_ += size;
}

void VaArena::Erase(absl::btree_map<CUdeviceptr, size_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  free_by_address_.erase(it);
}

void ReservationMap::Add(CUdeviceptr base, size_t size, int device) {
  MutexLock lock(&mu_);
  ranges_[base] = {size, device};
}

void ReservationMap::Remove(CUdeviceptr base) {
  MutexLock lock(&mu_);
  ranges_.erase(base);
}

int ReservationMap::DeviceOf(CUdeviceptr ptr) const {
  ReaderMutexLock lock(&mu_);
  auto it = ranges_.upper_bound(ptr);
  if (it == ranges_.begin()) return -1;
  --it;
  return ptr < it->first + it->second.first ? it->second.second : -1;
}

void ReservationMap::AfterForkChild() { new (&mu_) Mutex; }

}  // namespace vmmshim

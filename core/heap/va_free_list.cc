#include "core/heap/va_free_list.h"

#include <algorithm>
#include <iterator>
#include <new>
#include <utility>

namespace vmmshim {

void VaFreeList::AddReservation(CUdeviceptr base, size_t size) {
  reservations_[base] = size;
  reserved_bytes_ += size;
  Insert(base, size);
}

std::optional<CUdeviceptr> VaFreeList::Allocate(size_t size) {
  auto it = free_by_size_.lower_bound({size, 0});
  if (it == free_by_size_.end()) return std::nullopt;
  const auto [range_size, base] = *it;
  Erase(free_by_address_.find(base));
  if (range_size > size) Insert(base + size, range_size - size);
  return base;
}

void VaFreeList::Free(CUdeviceptr base, size_t size) {
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

bool VaFreeList::Contains(CUdeviceptr ptr) const {
  auto it = reservations_.upper_bound(ptr);
  if (it == reservations_.begin()) return false;
  --it;
  return ptr < it->first + it->second;
}

absl::btree_map<CUdeviceptr, size_t>::const_iterator VaFreeList::ReservationOf(
    CUdeviceptr ptr) const {
  return std::prev(reservations_.upper_bound(ptr));
}

void VaFreeList::Insert(CUdeviceptr base, size_t size) {
  free_by_address_[base] = size;
  free_by_size_.insert({size, base});
  free_bytes_ += size;
}

void VaFreeList::Erase(absl::btree_map<CUdeviceptr, size_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  free_by_address_.erase(it);
}

ReservationMap::~ReservationMap() = default;

void ReservationMap::PublishLocked(Snapshot next) {
  snapshots_.push_back(std::make_unique<const Snapshot>(std::move(next)));
  current_.store(snapshots_.back().get(), std::memory_order_release);
}

void ReservationMap::Add(CUdeviceptr base, size_t size, int device, int arena) {
  MutexLock lock(&mu_);
  const Snapshot* now = current_.load(std::memory_order_relaxed);
  Snapshot next = now != nullptr ? *now : Snapshot{};
  auto at = std::lower_bound(next.begin(), next.end(), base,
                             [](const Entry& e, CUdeviceptr b) { return e.base < b; });
  next.insert(at, Entry{base, size, Owner{device, arena}});
  PublishLocked(std::move(next));
}

void ReservationMap::Remove(CUdeviceptr base) {
  MutexLock lock(&mu_);
  const Snapshot* now = current_.load(std::memory_order_relaxed);
  if (now == nullptr) return;
  Snapshot next;
  for (const Entry& e : *now) {
    if (e.base != base) next.push_back(e);
  }
  PublishLocked(std::move(next));
}

ReservationMap::Owner ReservationMap::Lookup(CUdeviceptr ptr) const {
  const Snapshot* now = current_.load(std::memory_order_acquire);
  if (now == nullptr) return {};
  auto it = std::upper_bound(now->begin(), now->end(), ptr,
                             [](CUdeviceptr p, const Entry& e) { return p < e.base; });
  if (it == now->begin()) return {};
  --it;
  return ptr < it->base + it->size ? it->owner : Owner{};
}

void ReservationMap::AfterForkChild() { new (&mu_) Mutex; }

}  // namespace vmmshim

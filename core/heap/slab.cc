#include "core/heap/slab.h"

#include <algorithm>
#include <iterator>

namespace vmmshim {

Slab::Slab(size_t size) : units_(size / kUnit), bits_((units_ + 63) / 64, 0) {}

size_t Slab::Alignment(size_t bytes) {
  const size_t count = (bytes + kUnit - 1) / kUnit;
  return count == 0 ? kUnit : (count & (~count + 1)) * kUnit;
}

std::optional<size_t> Slab::Allocate(size_t bytes) {
  if (bytes == 0 || bytes > size()) return std::nullopt;
  const size_t count = (bytes + kUnit - 1) / kUnit;
  if (count > units_ - used_units_) return std::nullopt;
  const size_t align = count & (~count + 1);
  std::optional<size_t> first = FindRun(hint_, count, align);
  if (!first && hint_ != 0) first = FindRun(0, count, align);
  if (!first) return std::nullopt;
  Mark(*first, count, true);
  used_units_ += count;
  hint_ = *first + count == units_ ? 0 : *first + count;
  live_[static_cast<uint32_t>(*first)] = static_cast<uint32_t>(bytes);
  requested_bytes_ += bytes;
  return *first * kUnit;
}

std::optional<size_t> Slab::Free(size_t offset) {
  if (offset % kUnit != 0) return std::nullopt;
  auto it = live_.find(static_cast<uint32_t>(offset / kUnit));
  if (it == live_.end()) return std::nullopt;
  const size_t bytes = it->second;
  const size_t count = (bytes + kUnit - 1) / kUnit;
  Mark(it->first, count, false);
  // The next search starts at the hole just made: a program that frees and
  // allocates the same size again (the common case) gets it back without a
  // scan over the units in use after it.
  hint_ = it->first;
  used_units_ -= count;
  requested_bytes_ -= bytes;
  live_.erase(it);
  return bytes;
}

bool Slab::Resize(size_t offset, size_t bytes) {
  if (offset % kUnit != 0 || bytes == 0) return false;
  auto it = live_.find(static_cast<uint32_t>(offset / kUnit));
  if (it == live_.end() || (it->second + kUnit - 1) / kUnit != (bytes + kUnit - 1) / kUnit) {
    return false;
  }
  requested_bytes_ = requested_bytes_ - it->second + bytes;
  it->second = static_cast<uint32_t>(bytes);
  return true;
}

std::optional<std::pair<size_t, size_t>> Slab::Find(size_t offset) const {
  auto it = live_.upper_bound(static_cast<uint32_t>(offset / kUnit));
  if (it == live_.begin()) return std::nullopt;
  --it;
  const size_t start = size_t{it->first} * kUnit;
  const size_t units = (it->second + kUnit - 1) / kUnit;
  if (offset >= start + units * kUnit) return std::nullopt;
  return std::make_pair(start, size_t{it->second});
}

void Slab::Mark(size_t first, size_t count, bool used) {
  // A word at a time: a 64 KiB request is 256 units, four words.
  size_t u = first;
  const size_t end = first + count;
  while (u < end) {
    const size_t bit = u % 64;
    const size_t n = std::min<size_t>(64 - bit, end - u);
    const uint64_t mask = (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1)) << bit;
    if (used) {
      bits_[u / 64] |= mask;
    } else {
      bits_[u / 64] &= ~mask;
    }
    u += n;
  }
}

size_t Slab::NextUnit(size_t from, bool used) const {
  size_t w = from / 64;
  if (w >= bits_.size()) return units_;
  // Bits equal to `used` become ones; those below `from` are masked off.
  uint64_t word = (used ? bits_[w] : ~bits_[w]) & (~uint64_t{0} << (from % 64));
  while (word == 0) {
    if (++w == bits_.size()) return units_;
    word = used ? bits_[w] : ~bits_[w];
  }
  return std::min(units_, w * 64 + static_cast<size_t>(__builtin_ctzll(word)));
}

std::optional<size_t> Slab::FindRun(size_t from, size_t count, size_t align) const {
  size_t u = from;
  while (u < units_) {
    u = NextUnit(u, /*used=*/false);
    u = (u + align - 1) / align * align;  // may land on a used unit: then end == u
    if (u + count > units_) break;
    const size_t end = NextUnit(u, /*used=*/true);
    if (end - u >= count) return u;
    u = std::max(end, u + 1);
  }
  return std::nullopt;
}

}  // namespace vmmshim

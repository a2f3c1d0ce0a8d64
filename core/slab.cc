#include "core/slab.h"

#include <iterator>

namespace vmmshim {

Slab::Slab(size_t size) : units_(size / kUnit), bits_((units_ + 63) / 64, 0) {}

std::optional<size_t> Slab::Allocate(size_t bytes) {
  if (bytes == 0 || bytes > size()) return std::nullopt;
  const size_t count = (bytes + kUnit - 1) / kUnit;
  if (count > units_ - used_units_) return std::nullopt;
  std::optional<size_t> first = FindRun(hint_, count);
  if (!first && hint_ != 0) first = FindRun(0, count);
  if (!first) return std::nullopt;
  Mark(*first, count, true);
  used_units_ += count;
  hint_ = *first + count == units_ ? 0 : *first + count;
  live_[static_cast<uint32_t>(*first)] = static_cast<uint32_t>(bytes);
  return *first * kUnit;
}

std::optional<size_t> Slab::Free(size_t offset) {
  if (offset % kUnit != 0) return std::nullopt;
  auto it = live_.find(static_cast<uint32_t>(offset / kUnit));
  if (it == live_.end()) return std::nullopt;
  const size_t bytes = it->second;
  const size_t count = (bytes + kUnit - 1) / kUnit;
  Mark(it->first, count, false);
  used_units_ -= count;
  live_.erase(it);
  return bytes;
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
  for (size_t u = first; u < first + count; ++u) {
    const uint64_t bit = uint64_t{1} << (u % 64);
    if (used) {
      bits_[u / 64] |= bit;
    } else {
      bits_[u / 64] &= ~bit;
    }
  }
}

std::optional<size_t> Slab::FindRun(size_t from, size_t count) const {
  size_t run = 0;
  for (size_t u = from; u < units_; ++u) {
    // Skip whole used words quickly.
    if (run == 0 && u % 64 == 0 && bits_[u / 64] == ~uint64_t{0}) {
      u += 63;
      continue;
    }
    if (IsFree(u)) {
      if (++run == count) return u + 1 - count;
    } else {
      run = 0;
    }
  }
  return std::nullopt;
}

}  // namespace vmmshim

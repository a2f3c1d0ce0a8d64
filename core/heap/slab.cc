#include "core/heap/slab.h"

#include <algorithm>

namespace vmmshim {

Slab::Slab(size_t size)
    : units_(size / kUnit),
      used_((units_ + 63) / 64, 0),
      starts_((units_ + 63) / 64, 0),
      bytes_(units_, 0),
      origins_(units_, 0) {}

size_t Slab::Alignment(size_t bytes) {
  const size_t count = Units(bytes);
  return count == 0 ? kUnit : (count & (~count + 1)) * kUnit;
}

std::optional<size_t> Slab::Allocate(size_t bytes, uint16_t origin) {
  if (bytes == 0 || bytes > size()) return std::nullopt;
  const size_t count = Units(bytes);
  if (count > units_ - used_units_) return std::nullopt;
  const size_t align = count & (~count + 1);
  std::optional<size_t> first = FindRun(hint_, count, align);
  if (!first && hint_ != 0) first = FindRun(0, count, align);
  if (!first) return std::nullopt;
  Mark(*first, count, true);
  starts_[*first / 64] |= uint64_t{1} << (*first % 64);
  bytes_[*first] = static_cast<uint32_t>(bytes);
  origins_[*first] = origin;
  used_units_ += count;
  ++allocations_;
  requested_bytes_ += bytes;
  hint_ = *first + count == units_ ? 0 : *first + count;
  return *first * kUnit;
}

std::optional<size_t> Slab::Free(size_t offset) {
  if (offset % kUnit != 0 || offset >= size()) return std::nullopt;
  const size_t first = offset / kUnit;
  if (!StartsAt(first)) return std::nullopt;
  const size_t bytes = bytes_[first];
  const size_t count = Units(bytes);
  starts_[first / 64] &= ~(uint64_t{1} << (first % 64));
  Mark(first, count, false);
  // The next search starts at the hole just made: a program that frees and
  // allocates the same size again (the common case) gets it back without a
  // scan over the units in use after it.
  hint_ = first;
  used_units_ -= count;
  --allocations_;
  requested_bytes_ -= bytes;
  return bytes;
}

bool Slab::Resize(size_t offset, size_t bytes) {
  if (offset % kUnit != 0 || offset >= size() || bytes == 0) return false;
  const size_t first = offset / kUnit;
  if (!StartsAt(first) || Units(bytes_[first]) != Units(bytes)) return false;
  requested_bytes_ = requested_bytes_ - bytes_[first] + bytes;
  bytes_[first] = static_cast<uint32_t>(bytes);
  return true;
}

std::optional<std::pair<size_t, size_t>> Slab::Find(size_t offset) const {
  if (offset >= size()) return std::nullopt;
  const size_t u = offset / kUnit;
  if (((used_[u / 64] >> (u % 64)) & 1) == 0) return std::nullopt;
  // The unit is used, so a start lies at or below it within its allocation.
  size_t w = u / 64;
  uint64_t word = starts_[w] & (~uint64_t{0} >> (63 - u % 64));  // bits 0..u%64
  while (word == 0) word = starts_[--w];
  const size_t start = w * 64 + 63 - static_cast<size_t>(__builtin_clzll(word));
  return std::make_pair(start * kUnit, size_t{bytes_[start]});
}

void Slab::ForEach(absl::FunctionRef<void(size_t, size_t, uint16_t)> fn) const {
  for (size_t w = 0; w < starts_.size(); ++w) {
    for (uint64_t word = starts_[w]; word != 0; word &= word - 1) {
      const size_t u = w * 64 + static_cast<size_t>(__builtin_ctzll(word));
      fn(u * kUnit, bytes_[u], origins_[u]);
    }
  }
}

void Slab::Mark(size_t first, size_t count, bool used) {
  // A word at a time: a 64 KiB request is 128 units, two words.
  size_t u = first;
  const size_t end = first + count;
  while (u < end) {
    const size_t bit = u % 64;
    const size_t n = std::min<size_t>(64 - bit, end - u);
    const uint64_t mask = (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1)) << bit;
    if (used) {
      used_[u / 64] |= mask;
    } else {
      used_[u / 64] &= ~mask;
    }
    u += n;
  }
}

size_t Slab::NextUnit(size_t from, bool used, size_t limit) const {
  if (from >= limit) return limit;
  size_t w = from / 64;
  const size_t last = (limit - 1) / 64;
  // Bits equal to `used` become ones; those below `from` are masked off.
  uint64_t word = (used ? used_[w] : ~used_[w]) & (~uint64_t{0} << (from % 64));
  while (word == 0) {
    if (++w > last) return limit;
    word = used ? used_[w] : ~used_[w];
  }
  return std::min(limit, w * 64 + static_cast<size_t>(__builtin_ctzll(word)));
}

std::optional<size_t> Slab::FindRun(size_t from, size_t count, size_t align) const {
  size_t u = from;
  while (u < units_) {
    u = NextUnit(u, /*used=*/false, units_);
    u = (u + align - 1) / align * align;  // may land on a used unit: then end == u
    if (u + count > units_) break;
    // Only the run's own units are read: scanning to the end of the free
    // space after a hole cost a 256 B cache hit a thousand instructions in
    // a mostly empty granule.
    const size_t end = NextUnit(u, /*used=*/true, u + count);
    if (end - u >= count) return u;
    u = std::max(end, u + 1);
  }
  return std::nullopt;
}

}  // namespace vmmshim

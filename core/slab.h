// Packing of small allocations into one physical granule.
//
// A Slab manages the bytes of one granule (one cuMemCreate handle of the
// device's allocation granularity, mapped once) in units of kUnit = 256
// bytes: every allocation starts on a unit boundary, which gives
// cudaMalloc's alignment guarantee (CUDA Programming Guide: "memory is
// aligned to at least 256 bytes"). A request takes ceil(bytes / 256) units,
// first fit from a moving hint, so 10,000 x 256 B fill 10,000 units (about
// 2.5 MiB) instead of 10,000 granules.
//
// The slab stores no device data and makes no driver calls; offsets are
// relative to the granule's base address.
// Thread safety: none; the owning device heap serializes calls.
#ifndef VMMSHIM_CORE_SLAB_H_
#define VMMSHIM_CORE_SLAB_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/btree_map.h"

namespace vmmshim {

class Slab {
 public:
  static constexpr size_t kUnit = 256;

  // `size` is the granule's size in bytes, a multiple of kUnit.
  explicit Slab(size_t size);

  // The offset of a new allocation of `bytes` (1..size()), or nullopt when no
  // run of free units is long enough.
  std::optional<size_t> Allocate(size_t bytes);

  // Frees the allocation that starts at `offset`; returns its requested size
  // in bytes, or nullopt when no allocation starts there (interior pointer or
  // double free).
  std::optional<size_t> Free(size_t offset);

  // The (start offset, requested bytes) of the allocation containing
  // `offset`, or nullopt when that byte is free.
  std::optional<std::pair<size_t, size_t>> Find(size_t offset) const;

  size_t size() const { return units_ * kUnit; }
  size_t used_bytes() const { return used_units_ * kUnit; }
  bool empty() const { return used_units_ == 0; }
  size_t allocations() const { return live_.size(); }
  // The bytes requested by the live allocations (not rounded to units).
  size_t requested_bytes() const { return requested_bytes_; }

 private:
  void Mark(size_t first, size_t count, bool used);
  // The first unit at or after `from` whose state is `used`, or units_.
  size_t NextUnit(size_t from, bool used) const;
  // First unit of a free run of `count` units at or after `from`, scanning
  // to the end; nullopt when none.
  std::optional<size_t> FindRun(size_t from, size_t count) const;

  size_t units_;
  size_t used_units_ = 0;
  size_t requested_bytes_ = 0;
  size_t hint_ = 0;
  std::vector<uint64_t> bits_;                   // 1 = used
  absl::btree_map<uint32_t, uint32_t> live_;     // first unit -> requested bytes
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_SLAB_H_

// Packing of small allocations into one physical granule.
//
// A Slab manages the bytes of one granule (one cuMemCreate handle of the
// device's allocation granularity, mapped once) in units of kUnit = 512
// bytes, and aligns each allocation as the driver's cuMemAlloc does.
//
// Alignment, measured on H200 (driver 13.0, examples/parity_probe.cu): every
// cuMemAlloc pointer is at least 512-byte aligned (the device's
// CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT; a texture over a linear buffer
// needs it), and allocations of one size S come back aligned to the lowest
// set bit of S rounded up to 512: 1 KiB, 4 KiB, 64 KiB allocations are 1 KiB,
// 4 KiB, 64 KiB aligned, 1500 B ones 512 B, 3000 B ones 1 KiB. A request
// therefore takes n = ceil(bytes / 512) units and starts on a multiple of
// the lowest set bit of n: first fit from a moving hint. 10,000 x 256 B fill
// 10,000 units (4.9 MiB, three granules) as natively (6 MiB).
//
// The slab stores no device data and makes no driver calls; offsets are
// relative to the granule's base address.
// Thread safety: none; the owning device heap serializes calls.
#ifndef VMMSHIM_CORE_HEAP_SLAB_H_
#define VMMSHIM_CORE_HEAP_SLAB_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/btree_map.h"

namespace vmmshim {

class Slab {
 public:
  static constexpr size_t kUnit = 512;

  // `size` is the granule's size in bytes, a multiple of kUnit.
  explicit Slab(size_t size);

  // The offset of a new allocation of `bytes` (1..size()), a multiple of
  // Alignment(bytes), or nullopt when no aligned run of free units is long
  // enough.
  std::optional<size_t> Allocate(size_t bytes);

  // Frees the allocation that starts at `offset`; returns its requested size
  // in bytes, or nullopt when no allocation starts there (interior pointer or
  // double free).
  std::optional<size_t> Free(size_t offset);

  // Changes the requested size of the allocation starting at `offset` to
  // `bytes` when it takes the same number of units; false (nothing changed)
  // otherwise.
  bool Resize(size_t offset, size_t bytes);

  // The (start offset, requested bytes) of the allocation containing
  // `offset`, or nullopt when that byte is free.
  std::optional<std::pair<size_t, size_t>> Find(size_t offset) const;

  // The alignment the driver gives an allocation of `bytes` (header
  // comment): the lowest set bit of `bytes` rounded up to kUnit.
  static size_t Alignment(size_t bytes);

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
  // First unit, a multiple of `align` units, of a free run of `count` units
  // at or after `from`, scanning to the end; nullopt when none.
  std::optional<size_t> FindRun(size_t from, size_t count, size_t align) const;

  size_t units_;
  size_t used_units_ = 0;
  size_t requested_bytes_ = 0;
  size_t hint_ = 0;
  std::vector<uint64_t> bits_;                   // 1 = used
  absl::btree_map<uint32_t, uint32_t> live_;     // first unit -> requested bytes
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_SLAB_H_

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
// Index: flat arrays over the units, so that an allocation or a free touches
// only its own units' words and no tree is changed per call (a cache hit of
// a packed size is one Allocate, its cudaFree one Free):
//   used_    1 bit per unit, set while the unit is in use (FindRun reads it);
//   starts_  1 bit per unit, set where a live allocation starts: Free and
//            Resize test one bit; Find of an interior offset scans it
//            backwards a word at a time from the offset's unit (a used unit's
//            nearest start at or below it is its allocation's);
//   bytes_   uint32_t per unit, the requested bytes of the allocation that
//            starts there (unused elsewhere);
//   origins_ uint16_t per unit, the caller library of that allocation
//            (core/history/caller_library.h; 0: unknown).
// Host memory: 6 bytes and 2 bits per unit, 25 KiB per 2 MiB granule (4,096
// units), whatever the number of allocations. Sizes are below 4 GiB.
//
// The slab stores no device data and makes no driver calls; offsets are
// relative to the granule's base address.
// Thread safety: none; the owning device heap serializes calls.
#ifndef VMMSHIM_CORE_HEAP_SLAB_H_
#define VMMSHIM_CORE_HEAP_SLAB_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"

namespace vmmshim {

class Slab {
 public:
  static constexpr size_t kUnit = 512;

  // `size` is the granule's size in bytes, a multiple of kUnit.
  explicit Slab(size_t size);

  // The offset of a new allocation of `bytes` (1..size()), a multiple of
  // Alignment(bytes), or nullopt when no aligned run of free units is long
  // enough.
  // `origin`: who asked (a CallerLibraries id), kept with the allocation.
  std::optional<size_t> Allocate(size_t bytes, uint16_t origin = 0);

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

  // Calls fn(offset, requested bytes, origin) for each live allocation, in
  // address order.
  void ForEach(absl::FunctionRef<void(size_t, size_t, uint16_t)> fn) const;
  // The alignment the driver gives an allocation of `bytes` (header
  // comment): the lowest set bit of `bytes` rounded up to kUnit.
  static size_t Alignment(size_t bytes);

  size_t size() const { return units_ * kUnit; }
  size_t used_bytes() const { return used_units_ * kUnit; }
  bool empty() const { return used_units_ == 0; }
  size_t allocations() const { return allocations_; }
  // The bytes requested by the live allocations (not rounded to units).
  size_t requested_bytes() const { return requested_bytes_; }

 private:
  static size_t Units(size_t bytes) { return (bytes + kUnit - 1) / kUnit; }
  // Whether a live allocation starts at unit `u` (< units_).
  bool StartsAt(size_t u) const { return (starts_[u / 64] >> (u % 64)) & 1; }
  void Mark(size_t first, size_t count, bool used);
  // The first unit in [from, limit) whose state is `used`, or `limit`
  // (<= units_).
  size_t NextUnit(size_t from, bool used, size_t limit) const;
  // First unit, a multiple of `align` units, of a free run of `count` units
  // at or after `from`, scanning to the end; nullopt when none.
  std::optional<size_t> FindRun(size_t from, size_t count, size_t align) const;

  size_t units_;
  size_t used_units_ = 0;
  size_t allocations_ = 0;
  size_t requested_bytes_ = 0;
  size_t hint_ = 0;
  std::vector<uint64_t> used_;    // header comment
  std::vector<uint64_t> starts_;
  std::vector<uint32_t> bytes_;
  std::vector<uint16_t> origins_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_SLAB_H_

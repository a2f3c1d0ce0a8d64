// A set of device ordinals: which devices may, or do, access a mapping.
//
// Devices are CUDA device ordinals in [0, kMaxDevices). The set is one
// 64-bit word (bit d = device d), so it is cheap to copy, compare and hash,
// and the limit is stated once here rather than as a literal 64 in every
// loop. 64 is above any single node sold today (8 GPUs per HGX board, 72 in
// an NVL72 rack are separate nodes to the driver's peer model: at most 8
// peers per device in cuCtxEnablePeerAccess, see docs/multi-gpu.md).
//
// Thread safety: a value type; no shared state.
#ifndef VMMSHIM_CORE_BASE_DEVICE_SET_H_
#define VMMSHIM_CORE_BASE_DEVICE_SET_H_

#include <cstdint>
#include <vector>

namespace vmmshim {

inline constexpr int kMaxDevices = 64;

class DeviceSet {
 public:
  constexpr DeviceSet() = default;
  // The set whose bit d is set in `bits`.
  static constexpr DeviceSet FromBits(uint64_t bits) { return DeviceSet(bits); }
  // {device}; empty for an ordinal outside [0, kMaxDevices).
  static constexpr DeviceSet Of(int device) {
    return IsOrdinal(device) ? DeviceSet(uint64_t{1} << device) : DeviceSet();
  }
  // {0, 1, ..., count - 1}, count clamped to [0, kMaxDevices].
  static constexpr DeviceSet FirstN(int count) {
    return count <= 0 ? DeviceSet()
           : count >= kMaxDevices ? DeviceSet(~uint64_t{0})
                                  : DeviceSet((uint64_t{1} << count) - 1);
  }
  static constexpr bool IsOrdinal(int device) { return device >= 0 && device < kMaxDevices; }

  constexpr bool Contains(int device) const {
    return IsOrdinal(device) && ((bits_ >> device) & 1) != 0;
  }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr uint64_t bits() const { return bits_; }
  int size() const { return __builtin_popcountll(bits_); }

  void Add(int device) { bits_ |= Of(device).bits_; }
  void Remove(int device) { bits_ &= ~Of(device).bits_; }

  constexpr DeviceSet operator|(DeviceSet o) const { return DeviceSet(bits_ | o.bits_); }
  constexpr DeviceSet operator&(DeviceSet o) const { return DeviceSet(bits_ & o.bits_); }
  // Set difference: the devices of this set that are not in `o`.
  constexpr DeviceSet operator-(DeviceSet o) const { return DeviceSet(bits_ & ~o.bits_); }
  DeviceSet& operator|=(DeviceSet o) { bits_ |= o.bits_; return *this; }
  DeviceSet& operator&=(DeviceSet o) { bits_ &= o.bits_; return *this; }
  DeviceSet& operator-=(DeviceSet o) { bits_ &= ~o.bits_; return *this; }
  constexpr bool operator==(DeviceSet o) const { return bits_ == o.bits_; }
  constexpr bool operator!=(DeviceSet o) const { return bits_ != o.bits_; }

  // The members in increasing order: for (int d : set) ...
  class Iterator {
   public:
    explicit Iterator(uint64_t bits) : bits_(bits) {}
    int operator*() const { return __builtin_ctzll(bits_); }
    Iterator& operator++() {
      bits_ &= bits_ - 1;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return bits_ != o.bits_; }

   private:
    uint64_t bits_;
  };
  Iterator begin() const { return Iterator(bits_); }
  Iterator end() const { return Iterator(0); }

  // Calls fn(device) for each member, in increasing order.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (uint64_t b = bits_; b != 0; b &= b - 1) fn(__builtin_ctzll(b));
  }
  std::vector<int> ToVector() const {
    std::vector<int> out;
    ForEach([&](int d) { out.push_back(d); });
    return out;
  }

  template <typename H>
  friend H AbslHashValue(H h, DeviceSet s) {
    return H::combine(std::move(h), s.bits_);
  }

 private:
  constexpr explicit DeviceSet(uint64_t bits) : bits_(bits) {}
  uint64_t bits_ = 0;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_BASE_DEVICE_SET_H_

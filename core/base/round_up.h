// Rounding of byte counts, shared by the allocator's rooms.
#ifndef VMMSHIM_CORE_BASE_ROUND_UP_H_
#define VMMSHIM_CORE_BASE_ROUND_UP_H_

#include <cstddef>

namespace vmmshim {

// `value` rounded up to a multiple of `to` (> 0), in bytes. The caller keeps
// `value + to - 1` from overflowing (the allocator refuses such sizes first).
constexpr size_t RoundUp(size_t value, size_t to) { return (value + to - 1) / to * to; }

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_BASE_ROUND_UP_H_

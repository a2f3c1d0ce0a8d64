// What the stream-ordered cache's files share (stream_ordered_cache.cc: the
// blocks and their reuse; stream_ordered_readiness.cc: when blocks become
// ready). Not for other rooms.
#ifndef VMMSHIM_CORE_STREAM_ORDERED_STREAM_ORDERED_INTERNAL_H_
#define VMMSHIM_CORE_STREAM_ORDERED_STREAM_ORDERED_INTERNAL_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace vmmshim {
namespace stream_ordered_internal {

// Every this many frees, the caller harvests: blocks freed on streams that
// never allocate again become ready for the others, and the release
// threshold applies, at one cuStreamQuery per stream per period.
inline constexpr size_t kHarvestPeriod = 256;


// Frees are numbered process-wide, so that one mark taken before a
// synchronize covers every cache; and the blocks not yet ready are counted
// process-wide, so that a synchronize hook with nothing to do costs one load.
inline std::atomic<uint64_t> g_free_seq{0};
inline std::atomic<int64_t> g_pending{0};

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace stream_ordered_internal
}  // namespace vmmshim

#endif  // VMMSHIM_CORE_STREAM_ORDERED_STREAM_ORDERED_INTERNAL_H_

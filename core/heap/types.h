// The value types the heap hands out and the rooms above it share: what a
// pointer is (PointerInfo), what an allocation shares a mapping with
// (Placement), and the statistics of one device (DeviceStats) and of its
// stream-ordered part (StreamOrderedFigures). Units: bytes and counts.
// Plain values: copy freely; no locking.
#ifndef VMMSHIM_CORE_HEAP_TYPES_H_
#define VMMSHIM_CORE_HEAP_TYPES_H_

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "core/base/device_set.h"

namespace vmmshim {

// What became of a compression request on one device.
enum class CompressionState { kOff, kUnsupported, kGranted, kNotGranted };

struct PeerCounters {
  uint64_t grants = 0;   // allocations granted to this peer (by policy or explicitly)
  uint64_t denials = 0;  // allocations denied to this peer while it had access enabled
  uint64_t mapped_bytes = 0;       // bytes of this device's memory mapped into the peer now
  uint64_t peak_mapped_bytes = 0;  // the most mapped into it at any time
};

// The stream-ordered cache's figures of one device
// (core/stream_ordered/stream_ordered_cache.h), in the terms of
// cuMemPoolGetAttribute.
struct StreamOrderedFigures {
  uint64_t reserved = 0;       // the cache: live allocations' size classes plus cached bytes;
                               // PoolFigures: the physical blocks (DeviceCounters)
  uint64_t reserved_high = 0;
  uint64_t used = 0;           // requested bytes of live allocations
  uint64_t used_high = 0;
  uint64_t cached = 0;         // freed blocks held for reuse
  uint64_t live_allocations = 0;
  uint64_t allocations = 0;    // served, in total
  uint64_t reuses = 0;         // of them, served from this cache
  uint64_t frees = 0;
  uint64_t driver_queries = 0; // cuStreamQuery / cuEventQuery / cuEventRecord by harvests
  uint64_t release_threshold = 0;
};

struct DeviceStats {
  int device = -1;
  uint64_t allocations = 0;       // served from VMM
  uint64_t bytes = 0;             // their requested bytes
  uint64_t frees = 0;
  uint64_t live_allocations = 0;
  uint64_t live_bytes = 0;        // requested bytes of live allocations
  uint64_t peak_live_bytes = 0;
  uint64_t handles = 0;           // physical handles held
  uint64_t handle_bytes = 0;      // their bytes
  uint64_t peak_handle_bytes = 0;
  uint64_t set_access_calls = 0;
  uint64_t cache_hits = 0;        // large requests served from the cache
  uint64_t cache_misses = 0;      // large requests that made a new handle
  uint64_t cached_bytes = 0;      // mapped for reuse now
  uint64_t deferred_frees = 0;    // frees held back by a stream capture, now
  uint64_t exports = 0;           // allocations exported
  uint64_t context_releases = 0;  // ReleaseContext calls that released memory here
  uint64_t paused_bytes = 0;       // physical bytes released by pauses, not resumed yet
  uint64_t peak_paused_bytes = 0;  // the most paused at once
  uint64_t paused_blocks = 0;      // blocks paused now
  CompressionState compression = CompressionState::kOff;
  std::array<PeerCounters, kMaxDevices> peers{};  // indexed by peer device
  // The stream-ordered cache's figures (filled by the Allocator; the
  // allocations above include these).
  StreamOrderedFigures stream_ordered;
};

// What one device's shim memory holds now, by allocation tag
// (vmmshim_get_residency; core/report/residency.h). Bytes of physical
// memory: a packed granule counts whole under its tag (its free units are
// device memory too).
struct TagResidency {
  uint64_t resident_bytes = 0;  // mapped for live allocations (stream-ordered ones included)
  uint64_t paused_bytes = 0;    // released by a pause, not resumed: not device memory now
  // Of the paused bytes, those whose address maps nothing now (no view:
  // VMMSHIM_PAUSED_ACCESS=fault, contents kept where no view reaches them,
  // or not yet moved: Note [Views made late], core/heap/pause.h): an access
  // faults and loses the context. A view mapped for the owner alone (the
  // driver refused a peer's access) counts as mapped: the peer's access
  // faults.
  uint64_t paused_faulting_bytes = 0;
};
struct DeviceResidency {
  int device = -1;
  std::map<std::string, TagResidency> tags;  // "" the untagged
  uint64_t cached_bytes = 0;   // freed memory kept mapped for reuse (the heap's cache)
  uint64_t orphan_bytes = 0;   // handles or mappings whose release failed, retried later
  // Of the resident bytes, freed stream-ordered blocks waiting in the
  // stream-ordered cache (size classes; filled by MemoryControl).
  uint64_t stream_ordered_cached_bytes = 0;
  // Allocations the shim handed to the driver on this device and that are
  // not freed yet (filled by MemoryControl from CallCounters).
  uint64_t passed_through_bytes = 0;
  // Other libraries' own VMM memory (core/foreign/foreign_vmm.h; filled by
  // MemoryControl): resident bytes of the handles they made, by the tag at
  // cuMemCreate; of them, exported and mapped nowhere (both left alone by
  // pause); what they mapped of imported ones; and the paused bytes by tag.
  std::map<std::string, uint64_t> other_vmm_by_tag;
  std::map<std::string, uint64_t> other_vmm_paused_by_tag;
  // As TagResidency::paused_faulting_bytes, over the paused handles'
  // mappings (a handle mapped twice counts twice).
  uint64_t other_vmm_paused_faulting_bytes = 0;
  uint64_t other_vmm_exported_bytes = 0;
  uint64_t other_vmm_unmapped_bytes = 0;
  uint64_t other_vmm_imported_bytes = 0;
  uint64_t other_vmm_bytes() const {
    uint64_t sum = other_vmm_imported_bytes;
    for (const auto& [tag, b] : other_vmm_by_tag) sum += b;
    return sum;
  }
  uint64_t resident_bytes() const {
    uint64_t sum = cached_bytes + orphan_bytes;
    for (const auto& [tag, r] : tags) sum += r.resident_bytes;
    return sum;
  }
};

// What Find() knows about a pointer inside shim memory.
struct PointerInfo {
  CUdeviceptr allocation_base = 0;  // the pointer Allocate returned
  size_t allocation_size = 0;       // the bytes requested
  CUdeviceptr range_base = 0;       // the backing handle's mapping
  size_t range_size = 0;
  int device = -1;
  CUcontext context = nullptr;      // current when allocated
  bool packed = false;
  bool stream_ordered = false;      // cuMemAllocAsync memory (core/stream_ordered/stream_ordered_cache.h)
  // The rest of the placement, for a reuse of the memory: the peers the
  // policy allowed, the tag, and whether explicit grants or revokes apply.
  DeviceSet allowed;
  std::string tag;
  bool has_explicit = false;
  // Paused (its physical memory released, or being released by a pause):
  // not to be reused until freed.
  bool paused = false;
};

// The placement of an allocation (header comment). `stream_ordered`: the
// allocation is stream-ordered memory of the device's default pool, whose
// peers enable access with cuMemPoolSetAccess, not cuCtxEnablePeerAccess
// (CUDA Programming Guide, "Stream Ordered Memory Allocator", peer access):
// the two kinds never share a mapping, since access belongs to a mapping.
struct Placement {
  CUcontext context = nullptr;
  DeviceSet allowed;
  std::string tag;
  bool stream_ordered = false;
  bool operator==(const Placement& o) const {
    return context == o.context && allowed == o.allowed && tag == o.tag &&
           stream_ordered == o.stream_ordered;
  }
  template <typename H>
  friend H AbslHashValue(H h, const Placement& p) {
    return H::combine(std::move(h), p.context, p.allowed, p.tag, p.stream_ordered);
  }
};


// The largest cached block that may serve a large request of `rounded`
// bytes (rounded up to the granularity): at most a quarter is wasted. The
// heap's cache and the stream-ordered cache use the same rule, so a block
// one of them would hand out the other would too.
inline size_t LargestReusableBlock(size_t rounded) { return rounded + rounded / 4; }

// What an allocation call returns. served false: nothing was done, and the
// caller hands the request to the driver.
struct Allocation {
  CUdeviceptr ptr = 0;
  bool served = false;
  int device = -1;  // of the current context, when served
};

// One physical mapping of a heap (a large allocation's block or a packed
// one), as a snapshot or a report shows it: its parts tile it in address
// order, each a live allocation or free space.
struct SegmentPart {
  uint64_t offset = 0;     // from the segment's address
  uint64_t size = 0;       // bytes of the segment it takes (rounded as served)
  uint64_t requested = 0;  // the bytes asked for; 0: free space
  uint16_t origin = 0;     // the caller library (core/history/caller_library.h)
  bool live = false;
};
struct SegmentInfo {
  int device = -1;
  CUdeviceptr address = 0;
  uint64_t size = 0;        // a multiple of the granularity
  std::string tag;
  bool packed = false;
  bool stream_ordered = false;
  bool paused = false;      // its physical memory released by a pause
  bool cached = false;      // a freed large block kept for reuse
  std::vector<SegmentPart> parts;
};

// Sums of figures over arenas or devices: counts and bytes add; peaks and
// high marks take the larger (a peak of a sum is not the sum of peaks: the
// owner of the sum sets those from its own counters); compression takes the
// larger state (kOff < kUnsupported < kGranted < kNotGranted: one refusal is
// what the device reports).
StreamOrderedFigures& operator+=(StreamOrderedFigures& a, const StreamOrderedFigures& b);
DeviceStats& operator+=(DeviceStats& a, const DeviceStats& b);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_TYPES_H_

// The shim's options for its memory, one object: read once from the
// configuration (config/config.h, VMMSHIM_* variables; the runtime fills it
// in interpose/runtime.cc), owned by ShimCore (core/shim_core.h) and passed
// by reference to every room that reads it (tcmalloc's Parameters). The
// values a device's heap derives from it (granularity, reservation size,
// cache limit in bytes) are resolved once per device (HeapArena::Options,
// core/heap/heap_arena.h).
#ifndef VMMSHIM_CORE_HEAP_ALLOCATOR_OPTIONS_H_
#define VMMSHIM_CORE_HEAP_ALLOCATOR_OPTIONS_H_

#include <cstddef>
#include <cstdint>

#include "core/heap/pinned_pool.h"
#include "core/history/memory_history.h"
#include "core/peer/policy/peer_policy.h"

namespace vmmshim {

struct AllocatorOptions {
  // Requests of at most this many bytes are packed into shared granules.
  // 0 means half the device's granularity.
  size_t packing_threshold = 0;
  // Bytes per VA reservation; 0 means twice the device's total memory. Always
  // rounded up to the granularity; a larger request gets a reservation of its
  // own size.
  size_t reservation_bytes = 0;
  // Pitch alignment of AllocatePitch, in bytes (a power of two).
  size_t pitch_alignment = 512;
  // Which peers may map which allocations.
  PeerPolicy peer_policy;
  // The most each device keeps mapped for reuse after frees (freed large
  // blocks and empty granules): a percentage of the device's memory when
  // cache_limit_percent >= 0, else cache_limit_bytes.
  double cache_limit_percent = 10;
  size_t cache_limit_bytes = 0;
  // Physical memory is created with the POSIX file-descriptor handle type
  // where the device supports it (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_
  // DESCRIPTOR_SUPPORTED), so that Export can share it with other processes
  // (guide section 4.16.3). false: no handle type, nothing exportable.
  bool exportable = true;
  // Request generic compression (guide section 4.16.5.2) where the device
  // reports CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED; the first
  // handle is checked with cuMemGetAllocationPropertiesFromHandle and, when
  // the driver did not grant compression, later ones are made without it.
  bool compression = false;
  // Stream-ordered allocation (core/stream_ordered/stream_ordered_cache.h): a stream found busy
  // while its freed blocks wait is asked about again after this many
  // nanoseconds at the earliest, so that allocations that miss do not pay a
  // driver query each; 0: at every miss.
  int64_t stream_query_interval_ns = 20000;
  // Heap arenas per device (core/heap/device_heap.h); 0: the CPUs this process
  // may run on (sched_getaffinity), at most 8.
  int arenas = 0;
  // Threads copying contents to host memory and back (pauses with
  // contents; core/heap/host_backup.h); 0: the CPUs this process may run on, at
  // most 16 (more threads copy faster up to there: docs/performance.md, "Measurements behind the design", "Host backups").
  int copy_threads = 0;
  // Page-locked host memory made ahead for kept contents, from the first
  // device allocation, kept to the end of the process (core/heap/pinned_pool.h;
  // VMMSHIM_PINNED_POOL); 0: none.
  size_t pinned_pool_bytes = 0;
  // Paused memory stays addressable (VMMSHIM_PAUSED_ACCESS=host): kept
  // contents in host memory mapped at the paused address, scratch memory
  // where contents were dropped (core/heap/host_mapped_pool.h); false
  // (=fault): nothing is mapped there and an access faults. The preloaded
  // library's default is the variable's (config/config.h); this one is the
  // tests' and an embedder's.
  bool paused_memory_addressable = true;
  // The host memory kept for the next pause is released after this many
  // seconds unused (VMMSHIM_HOST_POOL_IDLE); 0: kept until exit.
  double host_pool_idle_seconds = 300;
  // The most host memory one device's pool holds (VMMSHIM_HOST_POOL_MAX);
  // 0: the host's limits alone.
  size_t host_pool_max_bytes = 0;
  // The host memory a pause lacks is made in the background for the next
  // pause, never on the pause's path (VMMSHIM_HOST_POOL_MAKE=background;
  // core/heap/host_mapped_pool.h); false: made by the pause itself (the
  // preloaded library's default is background, config/config.h).
  bool host_memory_in_background = false;
  // What one registration of the pinned pool covers (PinnedPool; not a
  // VMMSHIM_* setting: tests make it small to cut copies at its ends).
  size_t pinned_pool_chunk_bytes = PinnedPool::kDefaultChunkBytes;
  // Where segment events (mapped, released, paused, resumed) and peer
  // decisions are recorded (core/history/memory_history.h), while it is
  // enabled; null: nowhere. Must outlive the allocator.
  MemoryHistory* history = nullptr;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_ALLOCATOR_OPTIONS_H_

// The residency report (vmmshim_get_residency, vmmshim.residency(); the
// exit report and statistics file after any pause): the device memory the
// process holds now, by category, so that a user sees why nvidia-smi is not
// at zero after a pause (docs/pause-resume.md, "What is left").
//
// JSON, per device the shim served, bytes throughout:
//   device_total_bytes, device_free_bytes, device_used_bytes: cuMemGetInfo
//     in the device's primary context (null when it is not active, or when
//     the driver is not asked: the exit report; the shim never creates a
//     context to answer);
//   shim: by_tag {tag: {resident_bytes, paused_bytes, paused_faulting_bytes}}
//     (packed granules whole; paused bytes are not device memory now; of
//     them, paused_faulting_bytes map nothing now, so that an access faults
//     and loses the context: core/heap/types.h, TagResidency), cached_bytes (freed
//     memory kept mapped for reuse), release_pending_bytes (handles whose
//     release failed, retried), stream_ordered_cached_bytes (freed
//     stream-ordered blocks waiting for reuse; part of their tag's resident
//     bytes), resident_bytes (the sum that is device memory);
//   passed_through_bytes: cuMemAlloc/cuMemAllocPitch requests the shim handed
//     to the driver (no current context, a device without VMM), still live;
//   graph_memory_bytes: the driver's graph memory nodes
//     (cuDeviceGetGraphMemAttribute RESERVED_MEM_CURRENT; null if unknown);
//   driver_default_pool_bytes: the driver's own part of the default pool
//     (its RESERVED_MEM_CURRENT without the shim's; null if unknown);
//   other_libraries_vmm: {bytes, by_tag, paused_by_tag,
//     paused_faulting_bytes, left_alone {exported_bytes, imported_bytes,
//     unmapped_bytes, with a reason each}}: memory other libraries made with
//     cuMemCreate or imported and mapped themselves
//     (core/foreign/foreign_vmm.h), resident by the tag at cuMemCreate,
//     paused by tag, of the paused mappings the bytes that map nothing now
//     (as the shim's), and what a pause leaves alone;
//   unattributed_bytes: device_used_bytes less everything above: the CUDA
//     context, module images, pools the program created (null when
//     device_used_bytes is).
// and, for the process, host memory:
//   pinned_pool: {bytes, free_bytes, pinned_bytes, fill_seconds}: the pinned
//     pool (VMMSHIM_PINNED_POOL, core/heap/pinned_pool.h) as made so far (0
//     while it is being made, when it failed or when there is none); bytes
//     less free_bytes hold paused contents; pinned_bytes are page-locked now
//     (a deep sleep gives the pinning back, and copies take it again);
//   host_memory_for_pauses: [{device, kept_bytes, in_use_bytes,
//     scratch_bytes, made_bytes, make_seconds, reused_bytes, released_bytes,
//     made_in_background_bytes, queued_bytes, sized_by}]: the pinned host
//     memory paused memory stays addressable through
//     (core/heap/host_mapped_pool.h): kept for the next pause, holding paused
//     contents now, the scratch over dropped contents; made by pauses so far
//     (and the seconds they spent), taken again, released idle or over the
//     limit; made in the background (VMMSHIM_HOST_POOL_MAKE=background) and
//     still to be made there; and what sized it.
//
// Thread safety: any thread; the figures are a snapshot per arena, not one
// instant across the process. Driver calls: only with a driver table (below);
// they are queries, which no stream capture forbids.
#ifndef VMMSHIM_CORE_REPORT_RESIDENCY_H_
#define VMMSHIM_CORE_REPORT_RESIDENCY_H_

#include <string>

#include "core/memory_control.h"
#include "core/driver/driver_api.h"

namespace vmmshim {

// The report as a JSON document (2-space indented). `driver` nullptr: the
// shim's own figures only (the device_* figures and those derived from the
// driver are null), as at exit, when the driver may be gone.
std::string ResidencyJson(const MemoryControl& control, const DriverApi* driver);

// One clause for the exit report, from the shim's own figures (no driver
// call): "resident: device 0: 1048576 bytes (tag 'kv' 0 (paused 8589934592),
// untagged 1048576, cache 0; passed through 0; other libraries' VMM 0)".
std::string ResidencySummary(const MemoryControl& control);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_REPORT_RESIDENCY_H_

// The statistics file's schema (VMMSHIM_STATS_FILE, written by
// stats_report.h's WriteStatsFile; read by `vmmshim report` and `vmmshim
// compare`, cli/stats_file.h): every key, once. Writer and readers name keys
// only through these constants, so a key renamed here changes all of them,
// and tests/cli/stats_file_test.cc fails if a writer or reader spells one of
// its own.
//
// Shape (one JSON object; counts are unsigned integers, byte counts are in
// bytes, times in seconds as doubles):
//   {kPid, kVersion, kSchemaVersion, kPolicy,
//    kTotals: {totals::*},
//    kDevices: [{device::*, device::kStreamOrdered: {stream_ordered::*},
//                device::kPeers: [{peer::*}]}],
//    kResidency: [core/report/residency.h's per-device objects],
//    kHostMemoryForPauses: [core/report/residency.h's host_memory_for_pauses],
//    kDriverCalls: [{driver_call::*}]}
// Each k*Keys array lists the keys of one object, in the order written; the
// tests check that a written file has exactly those.
//
// Header-only constants; no state, safe from any thread.
#ifndef VMMSHIM_CORE_REPORT_STATS_SCHEMA_H_
#define VMMSHIM_CORE_REPORT_STATS_SCHEMA_H_

namespace vmmshim::stats_schema {

// Incremented when a key is renamed, removed or changes meaning (added keys
// do not): a reader refuses a file of a later schema rather than misread it.
inline constexpr int kSchemaVersionNumber = 1;

// The top level.
inline constexpr char kPid[] = "pid";                       // int: the writing process
inline constexpr char kVersion[] = "version";               // string: VMMSHIM_VERSION of the writer
inline constexpr char kSchemaVersion[] = "schema_version";  // int: kSchemaVersionNumber
inline constexpr char kPolicy[] = "policy";                 // string: PeerPolicy::Describe()
inline constexpr char kTotals[] = "totals";                 // object: totals::*
inline constexpr char kDevices[] = "devices";               // array of device::* objects
inline constexpr char kDriverCalls[] = "driver_calls";      // array of driver_call::* objects
// array: per device, what the process holds by tag and kind (the "devices"
// of core/report/residency.h, from the shim's own figures: the device_*
// and driver-derived figures are null in the file)
inline constexpr char kResidency[] = "residency";
// array: per device, the host memory kept for addressable pauses, and what
// was made, reused, released and made in the background over the process's
// life (the "host_memory_for_pauses" of core/report/residency.h; at exit the
// kept memory is released first, interpose/runtime.cc)
inline constexpr char kHostMemoryForPauses[] = "host_memory_for_pauses";
inline constexpr const char* kTopLevelKeys[] = {kPid,       kVersion, kSchemaVersion,
                                                kPolicy,    kTotals,  kDevices,
                                                kResidency, kHostMemoryForPauses, kDriverCalls};

// "totals": process-wide sums (AllocatorStats).
namespace totals {
inline constexpr char kServedAllocations[] = "served_allocations";  // count, served from VMM
inline constexpr char kServedBytes[] = "served_bytes";              // bytes requested of them
inline constexpr char kPassthroughAllocations[] = "passthrough_allocations";  // count, to the driver
inline constexpr char kPassthroughBytes[] = "passthrough_bytes";    // bytes
inline constexpr char kFrees[] = "frees";                           // count
inline constexpr char kLiveAllocations[] = "live_allocations";      // count, at exit
inline constexpr char kLiveBytes[] = "live_bytes";                  // bytes requested, at exit
inline constexpr char kPeakPhysicalBytes[] = "peak_physical_bytes";  // bytes, all devices at once
inline constexpr char kStreamOrderedAllocations[] = "stream_ordered_allocations";  // count
inline constexpr char kStreamOrderedReuses[] = "stream_ordered_reuses";  // count, from its cache
inline constexpr char kFreeSynchronizes[] = "free_synchronizes";    // count of context syncs
inline constexpr char kFreeSynchronizesShared[] = "free_synchronizes_shared";  // count of frees
                                                                    // covered by another's sync
inline constexpr char kPeerEnableCalls[] = "peer_enable_calls";     // count of cuCtxEnablePeerAccess
inline constexpr char kPeerEnableSeconds[] = "peer_enable_seconds";  // seconds in it (driver's
                                                                    // enable and shim's grants)
inline constexpr char kPausedBytes[] = "paused_bytes";              // bytes paused, at exit
inline constexpr char kPeakPausedBytes[] = "peak_paused_bytes";     // bytes, the most at once
inline constexpr const char* kKeys[] = {
    kServedAllocations,     kServedBytes,      kPassthroughAllocations,    kPassthroughBytes,
    kFrees,                 kLiveAllocations,  kLiveBytes,                 kPeakPhysicalBytes,
    kStreamOrderedAllocations, kStreamOrderedReuses, kFreeSynchronizes,    kFreeSynchronizesShared,
    kPeerEnableCalls,       kPeerEnableSeconds, kPausedBytes,              kPeakPausedBytes};
}  // namespace totals

// One element of "devices" (DeviceStats).
namespace device {
inline constexpr char kDevice[] = "device";                    // int: the CUDA ordinal
inline constexpr char kAllocations[] = "allocations";          // count, served from VMM
inline constexpr char kBytes[] = "bytes";                      // bytes requested of them
inline constexpr char kLiveBytes[] = "live_bytes";             // bytes requested, at exit
inline constexpr char kPeakLiveBytes[] = "peak_live_bytes";    // bytes
inline constexpr char kPhysicalBytes[] = "physical_bytes";     // bytes of handles held, at exit
inline constexpr char kPeakPhysicalBytes[] = "peak_physical_bytes";  // bytes
inline constexpr char kSetAccessCalls[] = "set_access_calls";  // count of cuMemSetAccess
inline constexpr char kCacheHits[] = "cache_hits";             // count of large requests reused
inline constexpr char kCacheMisses[] = "cache_misses";         // count that made a new handle
inline constexpr char kCachedBytes[] = "cached_bytes";         // bytes mapped for reuse, at exit
inline constexpr char kIpcExports[] = "ipc_exports";           // count
inline constexpr char kContextReleases[] = "context_releases";  // count that released memory
inline constexpr char kPausedBytes[] = "paused_bytes";         // bytes paused, at exit
inline constexpr char kPeakPausedBytes[] = "peak_paused_bytes";  // bytes
inline constexpr char kCompression[] = "compression";  // string: CompressionName (off,
                                                       // unsupported, granted, not granted)
inline constexpr char kStreamOrdered[] = "stream_ordered";  // object: stream_ordered::*
inline constexpr char kPeers[] = "peers";  // array of peer::*: the peers with any grant, denial
                                           // or mapped byte
inline constexpr const char* kKeys[] = {
    kDevice,         kAllocations,    kBytes,       kLiveBytes,    kPeakLiveBytes,
    kPhysicalBytes,  kPeakPhysicalBytes, kSetAccessCalls, kCacheHits, kCacheMisses,
    kCachedBytes,    kIpcExports,     kContextReleases, kPausedBytes, kPeakPausedBytes,
    kCompression,    kStreamOrdered,  kPeers};
}  // namespace device

// A device's "stream_ordered" (StreamOrderedFigures, as cuMemPoolGetAttribute
// names them).
namespace stream_ordered {
inline constexpr char kAllocations[] = "allocations";            // count served
inline constexpr char kReuses[] = "reuses";                      // count, from the cache
inline constexpr char kFrees[] = "frees";                        // count
inline constexpr char kLiveAllocations[] = "live_allocations";   // count, at exit
inline constexpr char kUsedBytes[] = "used_bytes";               // bytes requested, at exit
inline constexpr char kUsedHighBytes[] = "used_high_bytes";      // bytes
inline constexpr char kReservedBytes[] = "reserved_bytes";       // bytes, at exit
inline constexpr char kReservedHighBytes[] = "reserved_high_bytes";  // bytes
inline constexpr char kCachedBytes[] = "cached_bytes";           // bytes held for reuse, at exit
inline constexpr char kDriverQueries[] = "driver_queries";       // count of stream/event queries
inline constexpr const char* kKeys[] = {kAllocations,   kReuses,        kFrees,
                                        kLiveAllocations, kUsedBytes,   kUsedHighBytes,
                                        kReservedBytes, kReservedHighBytes, kCachedBytes,
                                        kDriverQueries};
}  // namespace stream_ordered

// One element of a device's "peers" (PeerCounters).
namespace peer {
inline constexpr char kPeer[] = "peer";                        // int: the peer's ordinal
inline constexpr char kGrants[] = "grants";                    // count of allocations granted
inline constexpr char kDenials[] = "denials";                  // count denied while enabled
inline constexpr char kMappedBytes[] = "mapped_bytes";         // bytes mapped into it, at exit
inline constexpr char kPeakMappedBytes[] = "peak_mapped_bytes";  // bytes, the most at once
inline constexpr const char* kKeys[] = {kPeer, kGrants, kDenials, kMappedBytes, kPeakMappedBytes};
}  // namespace peer

// One element of "driver_calls" (DriverCallCount; empty unless the driver
// table was instrumented, core/driver/driver_stats.h).
namespace driver_call {
inline constexpr char kEntry[] = "entry";      // string: the driver's exported name
inline constexpr char kCalls[] = "calls";      // count
inline constexpr char kSeconds[] = "seconds";  // seconds, all calls together
inline constexpr const char* kKeys[] = {kEntry, kCalls, kSeconds};
}  // namespace driver_call

}  // namespace vmmshim::stats_schema

#endif  // VMMSHIM_CORE_REPORT_STATS_SCHEMA_H_

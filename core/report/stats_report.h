// The statistics report: a JSON document (nlohmann::json) written at exit
// when VMMSHIM_STATS_FILE is set, and the one-line exit summary.
//
// JSON shape (units: bytes, seconds):
//   { "pid": int, "policy": str,
//     "totals": {"served_allocations", "served_bytes", "passthrough_allocations",
//                "passthrough_bytes", "frees", "live_allocations", "live_bytes",
//                "peak_physical_bytes", "stream_ordered_allocations",
//                "stream_ordered_reuses", "free_synchronizes",
//                "free_synchronizes_shared", "peer_enable_calls",
//                "peer_enable_seconds" (time in cuCtxEnablePeerAccess, the
//                driver's enable and the shim's grants together),
//                "paused_bytes", "peak_paused_bytes" (PauseMemory)},
//     "devices": [ {"device", "allocations", "bytes", "live_bytes", "peak_live_bytes",
//                   "physical_bytes", "peak_physical_bytes", "set_access_calls",
//                   "cache_hits", "cache_misses", "cached_bytes", "ipc_exports",
//                   "context_releases", "paused_bytes", "peak_paused_bytes",
//                   "compression" (CompressionName),
//                   "peers": [ {"peer", "grants", "denials", "mapped_bytes" (at exit),
//                               "peak_mapped_bytes"} ] } ],
//     "driver_calls": [ {"entry", "calls", "seconds"} ] }
// "peers" lists the peers with any grant, denial or mapped byte;
// "driver_calls" is empty unless the allocator's driver table was
// instrumented (core/driver/driver_stats.h).
#ifndef VMMSHIM_CORE_REPORT_STATS_REPORT_H_
#define VMMSHIM_CORE_REPORT_STATS_REPORT_H_

#include <string>

#include "absl/status/status.h"
#include "core/allocator.h"

namespace vmmshim {

std::string StatsJson(const Allocator& allocator, int pid);

// Writes StatsJson to `path` (replacing it). Errors name the path.
absl::Status WriteStatsFile(const Allocator& allocator, int pid, const std::string& path);

// "served N allocations (B bytes) from VMM, ...; peers: G grants, D denials,
// at most M bytes mapped into peers" (M: the per-peer peaks, added up);
// "; E IPC exports" and, where compression was requested, "; device D
// compression granted|not granted|unsupported"; after any pause, "; paused:
// P bytes now, at most Q".
std::string ExitSummary(const Allocator& allocator);

// "off", "unsupported", "granted", "not granted".
const char* CompressionName(CompressionState state);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_REPORT_STATS_REPORT_H_

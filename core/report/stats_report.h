// The statistics report: a JSON document (nlohmann::json) written at exit
// when VMMSHIM_STATS_FILE is set, and the one-line exit summary.
//
// The JSON's keys, their units and its schema version: stats_schema.h. Peers
// are listed with any grant, denial or mapped byte; "driver_calls" is empty
// unless the allocator's driver table was instrumented
// (core/driver/driver_stats.h).
#ifndef VMMSHIM_CORE_REPORT_STATS_REPORT_H_
#define VMMSHIM_CORE_REPORT_STATS_REPORT_H_

#include <string>

#include "absl/status/status.h"
#include "core/memory_control.h"

namespace vmmshim {

// The statistics of `control` as JSON (stats_schema.h), naming `pid`.
std::string StatsJson(const MemoryControl& control, int pid);

// Writes StatsJson to `path` (replacing it). Errors name the path.
absl::Status WriteStatsFile(const MemoryControl& control, int pid, const std::string& path);

// "served N allocations (B bytes) from VMM, ...; peers: G grants, D denials,
// at most M bytes mapped into peers" (M: the per-peer peaks, added up);
// "; E IPC exports" and, where compression was requested, "; device D
// compression granted|not granted|unsupported"; after any pause, "; paused:
// P bytes now, at most Q; resident: ..." (core/report/residency.h).
std::string ExitSummary(const MemoryControl& control);

// "off", "unsupported", "granted", "not granted".
const char* CompressionName(CompressionState state);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_REPORT_STATS_REPORT_H_

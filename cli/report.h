// `vmmshim report FILE`: a statistics file (cli/stats_file.h) as tables:
// the totals, one row per device, one per device and peer, and the driver
// calls when the file has them; `vmmshim report FILE...`: several processes'
// files as one table with their totals, or as JSON.
// Thread safety: a pure function.
#ifndef VMMSHIM_CLI_REPORT_H_
#define VMMSHIM_CLI_REPORT_H_

#include <string>
#include <vector>

#include "cli/stats_file.h"

namespace vmmshim::cli {

// The tables of `stats`, read from `path` (named in the heading).
std::string FormatReport(const StatsFile& stats, const std::string& path);

// One statistics file of a multi-process report, and where it was read.
struct ProcessStats {
  std::string path;
  StatsFile stats;
};

// `vmmshim report FILE...` (several processes: torchrun's ranks, a
// program's children): one row per process, in the order given, and the
// totals. Bytes and counts are added up; "peak physical" of the totals is
// the sum of each process's peak (an upper bound of the job's, whose peaks
// need not coincide). Fits 100 columns.
std::string FormatProcesses(const std::vector<ProcessStats>& processes);

// The same as a JSON document: {"processes": [{"path", "pid", "version",
// "policy", "figures": F}...], "totals": F}, F holding served_allocations,
// served_bytes, live_allocations, live_bytes, peak_physical_bytes,
// paused_bytes, passthrough_allocations, grants, denials and
// peak_mapped_bytes (bytes and counts).
std::string ProcessesJson(const std::vector<ProcessStats>& processes);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_REPORT_H_

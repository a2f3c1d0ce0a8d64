// `vmmshim report FILE`: a statistics file (cli/stats_file.h) as tables:
// the totals, one row per device, one per device and peer, and the driver
// calls when the file has them.
// Thread safety: a pure function.
#ifndef VMMSHIM_CLI_REPORT_H_
#define VMMSHIM_CLI_REPORT_H_

#include <string>

#include "cli/stats_file.h"

namespace vmmshim::cli {

// The tables of `stats`, read from `path` (named in the heading).
std::string FormatReport(const StatsFile& stats, const std::string& path);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_REPORT_H_

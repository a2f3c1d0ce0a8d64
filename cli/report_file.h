// `vmmshim report FILE`: what FILE is decides what is printed. A statistics
// file (VMMSHIM_STATS_FILE, `vmmshim run --stats`) is printed as tables
// (cli/report.h); compare's result file (compare.json) as compare's table
// (compare.h: FormatResultFile); anything else is refused with what was
// expected and what it lacks, never the JSON library's own words.
// Thread safety: a pure function of the file.
#ifndef VMMSHIM_CLI_REPORT_FILE_H_
#define VMMSHIM_CLI_REPORT_FILE_H_

#include <optional>
#include <string>

namespace vmmshim::cli {

// The text `vmmshim report` prints for the file at `path`; nullopt and
// `*error` (naming the path) when it is neither kind. `wide`: every column
// of compare's table.
std::optional<std::string> ReportFile(const std::string& path, bool wide, std::string* error);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_REPORT_FILE_H_

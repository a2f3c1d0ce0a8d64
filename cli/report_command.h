#ifndef VMMSHIM_CLI_REPORT_COMMAND_H_
#define VMMSHIM_CLI_REPORT_COMMAND_H_

// `vmmshim report [--wide] [--json] FILE...`.
//
// One file that is not a directory, without --json: printed by what it is
// (cli/report_file.h: a statistics file as tables, compare.json as compare's
// table); when it is missing, the files FILE.PID that the program's own
// children wrote (config/config.h, ChildStatsPath) are pointed to.
// Otherwise every FILE is a statistics file, and a directory stands for its
// *.json files that are statistics files (others, such as compare.json, are
// skipped with a line saying so): one row per process and the totals
// (cli/report.h), or the same as JSON with `json`.
//
// Writes the report to stdout and one line per problem, naming the file, to
// stderr. Returns the exit status: 0, or 1 when a named file could not be
// reported (the rest still are) or nothing could.

#include <string>
#include <vector>

namespace vmmshim::cli {

int ReportCommand(const std::vector<std::string>& files, bool wide, bool json);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_REPORT_COMMAND_H_

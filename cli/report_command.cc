#include "cli/report_command.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <utility>

#include "cli/report.h"
#include "cli/report_file.h"
#include "cli/stats_file.h"
#include "config/config.h"

namespace vmmshim::cli {
namespace {

int Report(const std::string& path, bool wide) {
  std::string error;
  const std::optional<std::string> text = ReportFile(path, wide, &error);
  if (!text) {
    std::fprintf(stderr, "vmmshim report: %s\n", error.c_str());
    // `vmmshim run --stats FILE`: a program that never used CUDA itself
    // (a shell, torchrun) wrote no FILE; its children wrote FILE.PID.
    if (access(path.c_str(), F_OK) != 0) {
      const std::string pattern = ChildStatsPath(path, "*");
      glob_t found{};
      if (glob(pattern.c_str(), 0, nullptr, &found) == 0 && found.gl_pathc > 0) {
        std::fprintf(stderr, "vmmshim report: processes the program started wrote %zu file(s) "
                     "named like it, such as %s\n", found.gl_pathc, found.gl_pathv[0]);
      }
      globfree(&found);
    }
    return 1;
  }
  std::fputs(text->c_str(), stdout);
  return 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// `vmmshim report FILE...` of statistics files: a directory stands for its
// *.json files that are statistics files (others, such as compare.json,
// are skipped with a line saying so); a named file that is not one is an
// error, said, and the rest are still reported. Exit status 1 when any was.
int ReportProcesses(const std::vector<std::string>& args, bool json) {
  std::vector<ProcessStats> processes;
  int status = 0;
  for (const std::string& arg : args) {
    std::vector<std::string> paths;
    const bool directory = IsDirectory(arg);
    if (directory) {
      glob_t found{};
      if (glob((arg + "/*.json").c_str(), 0, nullptr, &found) == 0) {
        paths.assign(found.gl_pathv, found.gl_pathv + found.gl_pathc);  // sorted by glob
      }
      globfree(&found);
      if (paths.empty()) {
        std::fprintf(stderr, "vmmshim report: %s: no .json files in this directory\n",
                     arg.c_str());
        status = 1;
      }
    } else {
      paths.push_back(arg);
    }
    for (const std::string& path : paths) {
      std::string error;
      std::optional<StatsFile> stats = ReadStatsFile(path, &error);
      if (stats) {
        processes.push_back({path, *std::move(stats)});
      } else if (directory) {
        std::fprintf(stderr, "vmmshim report: skipped %s\n", error.c_str());
      } else {
        std::fprintf(stderr, "vmmshim report: %s\n", error.c_str());
        status = 1;
      }
    }
  }
  if (processes.empty()) {
    std::fprintf(stderr, "vmmshim report: no statistics file to report\n");
    return 1;
  }
  std::fputs((json ? ProcessesJson(processes)
                   : FormatProcesses(processes))
                 .c_str(),
             stdout);
  return status;
}

}  // namespace

int ReportCommand(const std::vector<std::string>& files, bool wide, bool json) {
  if (files.size() == 1 && !json && !IsDirectory(files[0])) return Report(files[0], wide);
  return ReportProcesses(files, json);
}

}  // namespace vmmshim::cli

#include "cli/report_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "cli/compare/compare.h"
#include "cli/report.h"
#include "cli/stats_file.h"
#include "core/base/safe_file.h"
#include "nlohmann/json.hpp"

namespace vmmshim::cli {

std::optional<std::string> ReportFile(const std::string& path, bool wide, std::string* error) {
  // A shared job directory may hold another user's FIFO or link to a device:
  // regular files only, at most 256 MiB (core/base/safe_file.h).
  absl::StatusOr<std::string> read = ReadRegularFile(path, size_t{256} << 20);
  if (!read.ok()) {
    *error = std::string(read.status().message());
    return std::nullopt;
  }
  const std::string& text = *read;
  // compare.json is told apart by its own keys; everything else is read as
  // a statistics file, whose reader names what a file lacks.
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (compare::IsResultFile(doc)) return compare::FormatResultFile(doc, path, wide, error);
  const std::optional<StatsFile> stats = ParseStatsJson(text, path, error);
  if (!stats) return std::nullopt;
  return FormatReport(*stats, path);
}

}  // namespace vmmshim::cli

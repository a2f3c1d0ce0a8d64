#include "cli/report_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "cli/compare/compare.h"
#include "cli/report.h"
#include "cli/stats_file.h"
#include "nlohmann/json.hpp"

namespace vmmshim::cli {

std::optional<std::string> ReportFile(const std::string& path, bool wide, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // compare.json is told apart by its own keys; everything else is read as
  // a statistics file, whose reader names what a file lacks.
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (compare::IsResultFile(doc)) return compare::FormatResultFile(doc, path, wide, error);
  const std::optional<StatsFile> stats = ParseStatsJson(text, path, error);
  if (!stats) return std::nullopt;
  return FormatReport(*stats, path);
}

}  // namespace vmmshim::cli

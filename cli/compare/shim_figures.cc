// A run's statistics files, added up (compare.h: ReadShimFigures), and the
// median its summaries use.
#include <algorithm>
#include <map>
#include <utility>

#include "cli/compare/internal.h"
#include "cli/stats_file.h"

namespace vmmshim::compare {

ShimFigures ReadShimFigures(const std::vector<std::string>& files, std::string* error) {
  ShimFigures f;
  std::map<std::pair<int, int>, uint64_t> pairs;
  for (const std::string& path : files) {
    std::string why;
    const std::optional<cli::StatsFile> stats = cli::ReadStatsFile(path, &why);
    if (!stats) {
      if (error->empty()) *error = why;
      continue;
    }
    f.served_allocations += stats->totals.served_allocations;
    f.peak_physical_bytes += stats->totals.peak_physical_bytes;
    f.peer_enable_calls += stats->totals.peer_enable_calls;
    f.peer_enable_seconds += stats->totals.peer_enable_seconds;
    for (const cli::StatsDevice& d : stats->devices) {
      f.set_access_calls += d.set_access_calls;
      for (const cli::StatsPeer& p : d.peers) {
        f.grants += p.grants;
        f.denials += p.denials;
        f.mapped_into_peers_bytes += p.peak_mapped_bytes;
        if (p.denials > 0) pairs[{d.device, p.peer}] += p.denials;
      }
    }
    ++f.files;
  }
  for (const auto& [pair, denials] : pairs) {
    f.denials_by_pair.push_back({pair.first, pair.second, denials});
  }
  return f;
}

std::optional<double> Median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace vmmshim::compare

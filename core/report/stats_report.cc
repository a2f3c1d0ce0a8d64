#include "core/report/stats_report.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/driver/driver_stats.h"
#include "core/base/version.h"
#include "nlohmann/json.hpp"

namespace vmmshim {

const char* CompressionName(CompressionState state) {
  switch (state) {
    case CompressionState::kOff: return "off";
    case CompressionState::kUnsupported: return "unsupported";
    case CompressionState::kGranted: return "granted";
    case CompressionState::kNotGranted: return "not granted";
  }
  return "?";
}

std::string StatsJson(const Allocator& allocator, int pid) {
  const AllocatorStats t = allocator.GetStats();
  nlohmann::json doc;
  doc["pid"] = pid;
  doc["version"] = VMMSHIM_VERSION;
  doc["policy"] = allocator.peer_policy().Describe();
  doc["totals"] = {{"served_allocations", t.served_allocations},
                   {"served_bytes", t.served_bytes},
                   {"passthrough_allocations", t.passthrough_allocations},
                   {"passthrough_bytes", t.passthrough_bytes},
                   {"frees", t.frees},
                   {"live_allocations", t.live_allocations},
                   {"live_bytes", t.live_bytes},
                   {"peak_physical_bytes", t.peak_handle_bytes},
                   {"stream_ordered_allocations", t.stream_ordered_allocations},
                   {"stream_ordered_reuses", t.stream_ordered_reuses},
                   {"free_synchronizes", t.free_synchronizes},
                   {"free_synchronizes_shared", t.free_synchronizes_shared},
                   {"peer_enable_calls", t.peer_enable_calls},
                   {"peer_enable_seconds", t.peer_enable_seconds},
                   {"paused_bytes", t.paused_bytes},
                   {"peak_paused_bytes", t.peak_paused_bytes}};
  doc["devices"] = nlohmann::json::array();
  for (const DeviceStats& d : allocator.GetStats().devices) {
    nlohmann::json peers = nlohmann::json::array();
    for (size_t p = 0; p < d.peers.size(); ++p) {
      const PeerCounters& c = d.peers[p];
      if (c.grants == 0 && c.denials == 0 && c.peak_mapped_bytes == 0) continue;
      peers.push_back({{"peer", p},
                       {"grants", c.grants},
                       {"denials", c.denials},
                       {"mapped_bytes", c.mapped_bytes},
                       {"peak_mapped_bytes", c.peak_mapped_bytes}});
    }
    doc["devices"].push_back({{"device", d.device},
                              {"allocations", d.allocations},
                              {"bytes", d.bytes},
                              {"live_bytes", d.live_bytes},
                              {"peak_live_bytes", d.peak_live_bytes},
                              {"physical_bytes", d.handle_bytes},
                              {"peak_physical_bytes", d.peak_handle_bytes},
                              {"set_access_calls", d.set_access_calls},
                              {"cache_hits", d.cache_hits},
                              {"cache_misses", d.cache_misses},
                              {"cached_bytes", d.cached_bytes},
                              {"ipc_exports", d.exports},
                              {"context_releases", d.context_releases},
                              {"paused_bytes", d.paused_bytes},
                              {"peak_paused_bytes", d.peak_paused_bytes},
                              {"compression", CompressionName(d.compression)},
                              {"stream_ordered",
                               {{"allocations", d.stream_ordered.allocations},
                                {"reuses", d.stream_ordered.reuses},
                                {"frees", d.stream_ordered.frees},
                                {"live_allocations", d.stream_ordered.live_allocations},
                                {"used_bytes", d.stream_ordered.used},
                                {"used_high_bytes", d.stream_ordered.used_high},
                                {"reserved_bytes", d.stream_ordered.reserved},
                                {"reserved_high_bytes", d.stream_ordered.reserved_high},
                                {"cached_bytes", d.stream_ordered.cached},
                                {"driver_queries", d.stream_ordered.driver_queries}}},
                              {"peers", peers}});
  }
  doc["driver_calls"] = nlohmann::json::array();
  for (const DriverCallCount& c : DriverCallCounts()) {
    doc["driver_calls"].push_back(
        {{"entry", c.entry}, {"calls", c.calls}, {"seconds", c.seconds}});
  }
  return doc.dump(2);
}

absl::Status WriteStatsFile(const Allocator& allocator, int pid, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) {
    return absl::InvalidArgumentError(
        absl::StrCat("VMMSHIM_STATS_FILE: cannot open '", path, "': ", std::strerror(errno)));
  }
  out << StatsJson(allocator, pid) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("VMMSHIM_STATS_FILE: writing '", path, "' failed"));
  return absl::OkStatus();
}

std::string ExitSummary(const Allocator& allocator) {
  const AllocatorStats s = allocator.GetStats();
  uint64_t grants = 0, denials = 0, peak = 0, exports = 0, queries = 0;
  std::string compression;
  for (const DeviceStats& d : allocator.GetStats().devices) {
    exports += d.exports;
    queries += d.stream_ordered.driver_queries;
    if (d.compression != CompressionState::kOff) {
      absl::StrAppend(&compression, "; device ", d.device, " compression ",
                      CompressionName(d.compression));
    }
    for (const PeerCounters& c : d.peers) {
      grants += c.grants;
      denials += c.denials;
      peak += c.peak_mapped_bytes;
    }
  }
  return absl::StrCat("served ", s.served_allocations, " allocations (", s.served_bytes,
                      " bytes) from VMM, ", s.frees, " frees (",
                      s.free_synchronizes, " context synchronizes, ",
                      s.free_synchronizes_shared, " frees covered by another's), ",
                      s.live_allocations,
                      " still live (", s.live_bytes, " bytes); passed ",
                      s.passthrough_allocations, " allocations (", s.passthrough_bytes,
                      " bytes) through to the driver; peak physical memory ",
                      s.peak_handle_bytes, " bytes; peers: ", grants, " grants, ", denials,
                      " denials, at most ", peak, " bytes mapped into peers; ", exports,
                      " IPC exports", compression,
                      s.stream_ordered_allocations == 0
                          ? std::string()
                          : absl::StrCat("; stream-ordered: ", s.stream_ordered_allocations,
                                         " allocations served (", s.stream_ordered_reuses,
                                         " reused from its cache, ", queries,
                                         " driver queries)"),
                      s.peak_paused_bytes == 0
                          ? std::string()
                          : absl::StrCat("; paused: ", s.paused_bytes, " bytes now, at most ",
                                         s.peak_paused_bytes));
}

}  // namespace vmmshim

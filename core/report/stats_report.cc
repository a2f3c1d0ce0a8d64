#include "core/report/stats_report.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/base/safe_file.h"
#include "core/driver/driver_stats.h"
#include "core/base/version.h"
#include "core/report/residency.h"
#include "core/report/residency_devices.h"
#include "core/report/stats_schema.h"
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

std::string StatsJson(const MemoryControl& control, int pid) {
  namespace k = stats_schema;
  namespace kt = stats_schema::totals;
  namespace kd = stats_schema::device;
  namespace ks = stats_schema::stream_ordered;
  namespace kp = stats_schema::peer;
  namespace kc = stats_schema::driver_call;
  const AllocatorStats t = control.GetStats();
  nlohmann::json doc;
  doc[k::kPid] = pid;
  doc[k::kVersion] = VMMSHIM_VERSION;
  doc[k::kSchemaVersion] = k::kSchemaVersionNumber;
  doc[k::kPolicy] = control.peer_policy().Describe();
  doc[k::kTotals] = {{kt::kServedAllocations, t.served_allocations},
                     {kt::kServedBytes, t.served_bytes},
                     {kt::kPassthroughAllocations, t.passthrough_allocations},
                     {kt::kPassthroughBytes, t.passthrough_bytes},
                     {kt::kFrees, t.frees},
                     {kt::kLiveAllocations, t.live_allocations},
                     {kt::kLiveBytes, t.live_bytes},
                     {kt::kPeakPhysicalBytes, t.peak_handle_bytes},
                     {kt::kStreamOrderedAllocations, t.stream_ordered_allocations},
                     {kt::kStreamOrderedReuses, t.stream_ordered_reuses},
                     {kt::kFreeSynchronizes, t.free_synchronizes},
                     {kt::kFreeSynchronizesShared, t.free_synchronizes_shared},
                     {kt::kPeerEnableCalls, t.peer_enable_calls},
                     {kt::kPeerEnableSeconds, t.peer_enable_seconds},
                     {kt::kPausedBytes, t.paused_bytes},
                     {kt::kPeakPausedBytes, t.peak_paused_bytes}};
  doc[k::kDevices] = nlohmann::json::array();
  for (const DeviceStats& d : t.devices) {
    nlohmann::json peers = nlohmann::json::array();
    for (size_t p = 0; p < d.peers.size(); ++p) {
      const PeerCounters& c = d.peers[p];
      if (c.grants == 0 && c.denials == 0 && c.peak_mapped_bytes == 0) continue;
      peers.push_back({{kp::kPeer, p},
                       {kp::kGrants, c.grants},
                       {kp::kDenials, c.denials},
                       {kp::kMappedBytes, c.mapped_bytes},
                       {kp::kPeakMappedBytes, c.peak_mapped_bytes}});
    }
    doc[k::kDevices].push_back({{kd::kDevice, d.device},
                                {kd::kAllocations, d.allocations},
                                {kd::kBytes, d.bytes},
                                {kd::kLiveBytes, d.live_bytes},
                                {kd::kPeakLiveBytes, d.peak_live_bytes},
                                {kd::kPhysicalBytes, d.handle_bytes},
                                {kd::kPeakPhysicalBytes, d.peak_handle_bytes},
                                {kd::kSetAccessCalls, d.set_access_calls},
                                {kd::kCacheHits, d.cache_hits},
                                {kd::kCacheMisses, d.cache_misses},
                                {kd::kCachedBytes, d.cached_bytes},
                                {kd::kIpcExports, d.exports},
                                {kd::kContextReleases, d.context_releases},
                                {kd::kPausedBytes, d.paused_bytes},
                                {kd::kPeakPausedBytes, d.peak_paused_bytes},
                                {kd::kCompression, CompressionName(d.compression)},
                                {kd::kStreamOrdered,
                                 {{ks::kAllocations, d.stream_ordered.allocations},
                                  {ks::kReuses, d.stream_ordered.reuses},
                                  {ks::kFrees, d.stream_ordered.frees},
                                  {ks::kLiveAllocations, d.stream_ordered.live_allocations},
                                  {ks::kUsedBytes, d.stream_ordered.used},
                                  {ks::kUsedHighBytes, d.stream_ordered.used_high},
                                  {ks::kReservedBytes, d.stream_ordered.reserved},
                                  {ks::kReservedHighBytes, d.stream_ordered.reserved_high},
                                  {ks::kCachedBytes, d.stream_ordered.cached},
                                  {ks::kDriverQueries, d.stream_ordered.driver_queries}}},
                                {kd::kPeers, peers}});
  }
  // What is held, by tag and kind (the shim's own figures: the driver may
  // be gone at exit).
  doc[k::kResidency] = ResidencyDevices(control, nullptr);
  doc[k::kHostMemoryForPauses] = HostMemoryForPausesJson(control);
  doc[k::kDriverCalls] = nlohmann::json::array();
  for (const DriverCallCount& c : DriverCallCounts()) {
    doc[k::kDriverCalls].push_back(
        {{kc::kEntry, c.entry}, {kc::kCalls, c.calls}, {kc::kSeconds, c.seconds}});
  }
  return doc.dump(2);
}

absl::Status WriteStatsFile(const MemoryControl& control, int pid, const std::string& path) {
  // Note [Replacing a file safely] (core/base/safe_file.h).
  return ReplaceFile(path, StatsJson(control, pid) + "\n", "VMMSHIM_STATS_FILE");
}

std::string ExitSummary(const MemoryControl& control) {
  const AllocatorStats s = control.GetStats();
  uint64_t grants = 0, denials = 0, peak = 0, exports = 0, queries = 0;
  std::string compression;
  for (const DeviceStats& d : control.GetStats().devices) {
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
                                         s.peak_paused_bytes, "; ",
                                         ResidencySummary(control)));
}

}  // namespace vmmshim

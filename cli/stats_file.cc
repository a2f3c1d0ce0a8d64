#include "cli/stats_file.h"

#include <fstream>
#include <iterator>

#include "core/report/stats_schema.h"
#include "nlohmann/json.hpp"

namespace vmmshim::cli {
namespace {

namespace k = stats_schema;
namespace kt = stats_schema::totals;
namespace kd = stats_schema::device;
namespace ks = stats_schema::stream_ordered;
namespace kp = stats_schema::peer;
namespace kc = stats_schema::driver_call;

// Keys every file since the first has; at() throws (and the file is refused)
// when one is missing.
template <typename T>
void Required(const nlohmann::json& object, const char* key, T* value) {
  *value = object.at(key).get<T>();
}

// Keys later builds added: an earlier build's file reads them as zero.
template <typename T>
void Optional(const nlohmann::json& object, const char* key, T* value) {
  if (const auto it = object.find(key); it != object.end()) *value = it->get<T>();
}

StatsDevice ParseDevice(const nlohmann::json& d) {
  StatsDevice out;
  Required(d, kd::kDevice, &out.device);
  Required(d, kd::kAllocations, &out.allocations);
  Required(d, kd::kBytes, &out.bytes);
  Optional(d, kd::kLiveBytes, &out.live_bytes);
  Required(d, kd::kPeakLiveBytes, &out.peak_live_bytes);
  Optional(d, kd::kPhysicalBytes, &out.physical_bytes);
  Required(d, kd::kPeakPhysicalBytes, &out.peak_physical_bytes);
  Required(d, kd::kSetAccessCalls, &out.set_access_calls);
  Optional(d, kd::kCacheHits, &out.cache_hits);
  Optional(d, kd::kCacheMisses, &out.cache_misses);
  Optional(d, kd::kCachedBytes, &out.cached_bytes);
  Optional(d, kd::kIpcExports, &out.ipc_exports);
  Optional(d, kd::kContextReleases, &out.context_releases);
  Optional(d, kd::kPausedBytes, &out.paused_bytes);
  Optional(d, kd::kPeakPausedBytes, &out.peak_paused_bytes);
  Optional(d, kd::kCompression, &out.compression);
  if (const auto so = d.find(kd::kStreamOrdered); so != d.end()) {
    StatsStreamOrdered& s = out.stream_ordered;
    Required(*so, ks::kAllocations, &s.allocations);
    Required(*so, ks::kReuses, &s.reuses);
    Required(*so, ks::kFrees, &s.frees);
    Required(*so, ks::kLiveAllocations, &s.live_allocations);
    Required(*so, ks::kUsedBytes, &s.used_bytes);
    Required(*so, ks::kUsedHighBytes, &s.used_high_bytes);
    Required(*so, ks::kReservedBytes, &s.reserved_bytes);
    Required(*so, ks::kReservedHighBytes, &s.reserved_high_bytes);
    Required(*so, ks::kCachedBytes, &s.cached_bytes);
    Required(*so, ks::kDriverQueries, &s.driver_queries);
  }
  for (const nlohmann::json& p : d.at(kd::kPeers)) {
    StatsPeer peer;
    Required(p, kp::kPeer, &peer.peer);
    Required(p, kp::kGrants, &peer.grants);
    Required(p, kp::kDenials, &peer.denials);
    Required(p, kp::kMappedBytes, &peer.mapped_bytes);
    Required(p, kp::kPeakMappedBytes, &peer.peak_mapped_bytes);
    out.peers.push_back(peer);
  }
  return out;
}

}  // namespace

std::optional<StatsFile> ParseStatsJson(const std::string& text, const std::string& what,
                                        std::string* error) {
  StatsFile f;
  try {
    const nlohmann::json doc = nlohmann::json::parse(text);
    Optional(doc, k::kSchemaVersion, &f.schema_version);
    if (f.schema_version > k::kSchemaVersionNumber) {
      *error = what + " has statistics schema version " + std::to_string(f.schema_version) +
               "; this vmmshim reads up to " + std::to_string(k::kSchemaVersionNumber) +
               " (use the vmmshim that wrote it)";
      return std::nullopt;
    }
    Required(doc, k::kPid, &f.pid);
    f.version = "an earlier build";
    Optional(doc, k::kVersion, &f.version);
    Required(doc, k::kPolicy, &f.policy);
    const nlohmann::json& t = doc.at(k::kTotals);
    StatsTotals& s = f.totals;
    Required(t, kt::kServedAllocations, &s.served_allocations);
    Required(t, kt::kServedBytes, &s.served_bytes);
    Required(t, kt::kPassthroughAllocations, &s.passthrough_allocations);
    Required(t, kt::kPassthroughBytes, &s.passthrough_bytes);
    Optional(t, kt::kFrees, &s.frees);
    Required(t, kt::kLiveAllocations, &s.live_allocations);
    Optional(t, kt::kLiveBytes, &s.live_bytes);
    Required(t, kt::kPeakPhysicalBytes, &s.peak_physical_bytes);
    Optional(t, kt::kStreamOrderedAllocations, &s.stream_ordered_allocations);
    Optional(t, kt::kStreamOrderedReuses, &s.stream_ordered_reuses);
    Optional(t, kt::kFreeSynchronizes, &s.free_synchronizes);
    Optional(t, kt::kFreeSynchronizesShared, &s.free_synchronizes_shared);
    Optional(t, kt::kPeerEnableCalls, &s.peer_enable_calls);
    Optional(t, kt::kPeerEnableSeconds, &s.peer_enable_seconds);
    Optional(t, kt::kPausedBytes, &s.paused_bytes);
    Optional(t, kt::kPeakPausedBytes, &s.peak_paused_bytes);
    for (const nlohmann::json& d : doc.at(k::kDevices)) f.devices.push_back(ParseDevice(d));
    for (const nlohmann::json& c : doc.at(k::kDriverCalls)) {
      StatsDriverCall call;
      Required(c, kc::kEntry, &call.entry);
      Required(c, kc::kCalls, &call.calls);
      Required(c, kc::kSeconds, &call.seconds);
      f.driver_calls.push_back(call);
    }
  } catch (const nlohmann::json::exception& e) {
    *error = what + " is not a vmmshim statistics file: " + e.what();
    return std::nullopt;
  }
  return f;
}

std::optional<StatsFile> ReadStatsFile(const std::string& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot open " + path;
    return std::nullopt;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseStatsJson(text, path, error);
}

}  // namespace vmmshim::cli

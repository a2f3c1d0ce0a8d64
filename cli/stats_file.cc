#include "cli/stats_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <type_traits>

#include "core/base/safe_file.h"
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

// What a file lacks to be a statistics file, said by the key's path
// ("totals.served_allocations") rather than in the JSON library's words.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string Path(const std::string& where, const std::string& key) {
  return where.empty() ? key : where + "." + key;
}

std::string TypeOf(const nlohmann::json& v) {
  return v.is_null() ? "null" : (v.is_array() || v.is_object() ? "an " : "a ") +
                                    std::string(v.type_name());
}

template <typename T>
void Get(const nlohmann::json& v, const std::string& path, T* value) {
  constexpr bool kText = std::is_same_v<T, std::string>;
  if (kText ? !v.is_string() : !v.is_number()) {
    throw FormatError("'" + path + "' is " + TypeOf(v) + ", not " +
                      (kText ? "a string" : "a number"));
  }
  *value = v.get<T>();
}

const nlohmann::json& Object(const nlohmann::json& v, const std::string& path) {
  if (!v.is_object()) {
    throw FormatError(path.empty() ? "it is " + TypeOf(v) + ", not a JSON object"
                                   : "'" + path + "' is " + TypeOf(v) + ", not an object");
  }
  return v;
}

// Keys every file since the first has: a file without one is refused.
const nlohmann::json& Member(const nlohmann::json& object, const std::string& where,
                             const char* key) {
  const auto it = Object(object, where).find(key);
  if (it == object.end()) throw FormatError("it has no '" + Path(where, key) + "'");
  return *it;
}

template <typename T>
void Required(const nlohmann::json& object, const std::string& where, const char* key,
              T* value) {
  Get(Member(object, where, key), Path(where, key), value);
}

// Keys later builds added: an earlier build's file reads them as zero.
template <typename T>
void Optional(const nlohmann::json& object, const std::string& where, const char* key,
              T* value) {
  if (const auto it = Object(object, where).find(key); it != object.end()) {
    Get(*it, Path(where, key), value);
  }
}

const nlohmann::json& List(const nlohmann::json& object, const std::string& where,
                           const char* key) {
  const nlohmann::json& list = Member(object, where, key);
  if (!list.is_array()) {
    throw FormatError("'" + Path(where, key) + "' is " + TypeOf(list) + ", not a list");
  }
  return list;
}

StatsDevice ParseDevice(const nlohmann::json& d, const std::string& w) {
  StatsDevice out;
  Required(d, w, kd::kDevice, &out.device);
  Required(d, w, kd::kAllocations, &out.allocations);
  Required(d, w, kd::kBytes, &out.bytes);
  Optional(d, w, kd::kLiveBytes, &out.live_bytes);
  Required(d, w, kd::kPeakLiveBytes, &out.peak_live_bytes);
  Optional(d, w, kd::kPhysicalBytes, &out.physical_bytes);
  Required(d, w, kd::kPeakPhysicalBytes, &out.peak_physical_bytes);
  Required(d, w, kd::kSetAccessCalls, &out.set_access_calls);
  Optional(d, w, kd::kCacheHits, &out.cache_hits);
  Optional(d, w, kd::kCacheMisses, &out.cache_misses);
  Optional(d, w, kd::kCachedBytes, &out.cached_bytes);
  Optional(d, w, kd::kIpcExports, &out.ipc_exports);
  Optional(d, w, kd::kContextReleases, &out.context_releases);
  Optional(d, w, kd::kPausedBytes, &out.paused_bytes);
  Optional(d, w, kd::kPeakPausedBytes, &out.peak_paused_bytes);
  Optional(d, w, kd::kCompression, &out.compression);
  if (const auto so = d.find(kd::kStreamOrdered); so != d.end()) {
    const std::string ws = Path(w, kd::kStreamOrdered);
    StatsStreamOrdered& s = out.stream_ordered;
    Required(*so, ws, ks::kAllocations, &s.allocations);
    Required(*so, ws, ks::kReuses, &s.reuses);
    Required(*so, ws, ks::kFrees, &s.frees);
    Required(*so, ws, ks::kLiveAllocations, &s.live_allocations);
    Required(*so, ws, ks::kUsedBytes, &s.used_bytes);
    Required(*so, ws, ks::kUsedHighBytes, &s.used_high_bytes);
    Required(*so, ws, ks::kReservedBytes, &s.reserved_bytes);
    Required(*so, ws, ks::kReservedHighBytes, &s.reserved_high_bytes);
    Required(*so, ws, ks::kCachedBytes, &s.cached_bytes);
    Required(*so, ws, ks::kDriverQueries, &s.driver_queries);
  }
  const nlohmann::json& peers = List(d, w, kd::kPeers);
  for (size_t i = 0; i < peers.size(); ++i) {
    const nlohmann::json& p = peers[i];
    const std::string wp = Path(w, kd::kPeers) + "[" + std::to_string(i) + "]";
    StatsPeer peer;
    Required(p, wp, kp::kPeer, &peer.peer);
    Required(p, wp, kp::kGrants, &peer.grants);
    Required(p, wp, kp::kDenials, &peer.denials);
    Required(p, wp, kp::kMappedBytes, &peer.mapped_bytes);
    Required(p, wp, kp::kPeakMappedBytes, &peer.peak_mapped_bytes);
    out.peers.push_back(peer);
  }
  return out;
}

}  // namespace

std::optional<StatsFile> ParseStatsJson(const std::string& text, const std::string& what,
                                        std::string* error) {
  const std::string kind = what + " is not a vmmshim statistics file (one written by "
                                  "VMMSHIM_STATS_FILE or `vmmshim run --stats`): ";
  StatsFile f;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    *error = kind + "it is not JSON (it stops parsing at byte " + std::to_string(e.byte) + ")";
    return std::nullopt;
  }
  try {
    Optional(doc, "", k::kSchemaVersion, &f.schema_version);
    if (f.schema_version > k::kSchemaVersionNumber) {
      std::string writer;
      if (doc.contains(k::kVersion) && doc[k::kVersion].is_string()) {
        writer = ", written by vmmshim " + doc[k::kVersion].get<std::string>();
      }
      *error = what + " has statistics schema version " + std::to_string(f.schema_version) +
               writer + "; this vmmshim reads up to " +
               std::to_string(k::kSchemaVersionNumber) + " (use the vmmshim that wrote it)";
      return std::nullopt;
    }
    Required(doc, "", k::kPid, &f.pid);
    f.version = "an earlier build";
    Optional(doc, "", k::kVersion, &f.version);
    Required(doc, "", k::kPolicy, &f.policy);
    const std::string wt = k::kTotals;
    const nlohmann::json& t = Object(Member(doc, "", k::kTotals), wt);
    StatsTotals& s = f.totals;
    Required(t, wt, kt::kServedAllocations, &s.served_allocations);
    Required(t, wt, kt::kServedBytes, &s.served_bytes);
    Required(t, wt, kt::kPassthroughAllocations, &s.passthrough_allocations);
    Required(t, wt, kt::kPassthroughBytes, &s.passthrough_bytes);
    Optional(t, wt, kt::kFrees, &s.frees);
    Required(t, wt, kt::kLiveAllocations, &s.live_allocations);
    Optional(t, wt, kt::kLiveBytes, &s.live_bytes);
    Required(t, wt, kt::kPeakPhysicalBytes, &s.peak_physical_bytes);
    Optional(t, wt, kt::kStreamOrderedAllocations, &s.stream_ordered_allocations);
    Optional(t, wt, kt::kStreamOrderedReuses, &s.stream_ordered_reuses);
    Optional(t, wt, kt::kFreeSynchronizes, &s.free_synchronizes);
    Optional(t, wt, kt::kFreeSynchronizesShared, &s.free_synchronizes_shared);
    Optional(t, wt, kt::kPeerEnableCalls, &s.peer_enable_calls);
    Optional(t, wt, kt::kPeerEnableSeconds, &s.peer_enable_seconds);
    Optional(t, wt, kt::kPausedBytes, &s.paused_bytes);
    Optional(t, wt, kt::kPeakPausedBytes, &s.peak_paused_bytes);
    const nlohmann::json& devices = List(doc, "", k::kDevices);
    for (size_t i = 0; i < devices.size(); ++i) {
      const std::string wd = std::string(k::kDevices) + "[" + std::to_string(i) + "]";
      f.devices.push_back(ParseDevice(devices[i], wd));
    }
    const nlohmann::json& calls = List(doc, "", k::kDriverCalls);
    for (size_t i = 0; i < calls.size(); ++i) {
      const std::string wc = std::string(k::kDriverCalls) + "[" + std::to_string(i) + "]";
      StatsDriverCall call;
      Required(calls[i], wc, kc::kEntry, &call.entry);
      Required(calls[i], wc, kc::kCalls, &call.calls);
      Required(calls[i], wc, kc::kSeconds, &call.seconds);
      f.driver_calls.push_back(call);
    }
  } catch (const FormatError& e) {
    *error = kind + e.what();
    return std::nullopt;
  } catch (const nlohmann::json::exception& e) {
    // A number out of its type's range, say: never the library's own words.
    *error = kind + "a value of it cannot be read (" + std::to_string(e.id) + ")";
    return std::nullopt;
  }
  return f;
}

std::optional<StatsFile> ReadStatsFile(const std::string& path, std::string* error) {
  // A shared job directory may hold another user's FIFO or link to a device:
  // regular files only, at most 256 MiB (core/base/safe_file.h).
  absl::StatusOr<std::string> read = ReadRegularFile(path, size_t{256} << 20);
  if (!read.ok()) {
    *error = std::string(read.status().message());
    return std::nullopt;
  }
  const std::string& text = *read;
  return ParseStatsJson(text, path, error);
}

}  // namespace vmmshim::cli

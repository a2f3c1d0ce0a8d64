// A statistics file (VMMSHIM_STATS_FILE, core/report/stats_schema.h) read
// back into values, for `vmmshim report` and `vmmshim compare`. Every key
// is named through the schema; a file of a later schema version, or one
// missing a key this reader needs, is refused with a message naming the
// path. Units as in the schema: bytes, seconds, counts.
//
// Thread safety: ReadStatsFile and ParseStatsJson are pure functions of
// their input.
#ifndef VMMSHIM_CLI_STATS_FILE_H_
#define VMMSHIM_CLI_STATS_FILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vmmshim::cli {

struct StatsTotals {
  uint64_t served_allocations = 0, served_bytes = 0;
  uint64_t passthrough_allocations = 0, passthrough_bytes = 0;
  uint64_t frees = 0, live_allocations = 0, live_bytes = 0;
  uint64_t peak_physical_bytes = 0;
  uint64_t stream_ordered_allocations = 0, stream_ordered_reuses = 0;
  uint64_t free_synchronizes = 0, free_synchronizes_shared = 0;
  uint64_t peer_enable_calls = 0;
  double peer_enable_seconds = 0;
  uint64_t paused_bytes = 0, peak_paused_bytes = 0;
};

struct StatsStreamOrdered {
  uint64_t allocations = 0, reuses = 0, frees = 0, live_allocations = 0;
  uint64_t used_bytes = 0, used_high_bytes = 0, reserved_bytes = 0, reserved_high_bytes = 0;
  uint64_t cached_bytes = 0, driver_queries = 0;
};

struct StatsPeer {
  int peer = -1;
  uint64_t grants = 0, denials = 0, mapped_bytes = 0, peak_mapped_bytes = 0;
};

struct StatsDevice {
  int device = -1;
  uint64_t allocations = 0, bytes = 0, live_bytes = 0, peak_live_bytes = 0;
  uint64_t physical_bytes = 0, peak_physical_bytes = 0;
  uint64_t set_access_calls = 0, cache_hits = 0, cache_misses = 0, cached_bytes = 0;
  uint64_t ipc_exports = 0, context_releases = 0;
  uint64_t paused_bytes = 0, peak_paused_bytes = 0;
  std::string compression;  // "off", "unsupported", "granted", "not granted"
  StatsStreamOrdered stream_ordered;
  std::vector<StatsPeer> peers;  // those with any grant, denial or mapped byte
};

struct StatsDriverCall {
  std::string entry;
  uint64_t calls = 0;
  double seconds = 0;
};

struct StatsFile {
  int pid = 0;
  std::string version;  // the writer's VMMSHIM_VERSION; "an earlier build" when absent
  int schema_version = 0;  // 0: written before the file had one
  std::string policy;
  StatsTotals totals;
  std::vector<StatsDevice> devices;
  std::vector<StatsDriverCall> driver_calls;
};

// Parses the text of a statistics file. Keys that files of earlier builds
// lack (the version, the schema version, the stream-ordered, pause, cache,
// IPC, compression and peer-enable figures) read as zero or empty; any other
// missing key, a value of the wrong type, or a schema version above
// stats_schema::kSchemaVersionNumber gives nullopt and `*error` (naming
// `what`, e.g. the path).
std::optional<StatsFile> ParseStatsJson(const std::string& text, const std::string& what,
                                        std::string* error);

// ParseStatsJson of the file at `path`; one that cannot be read is an error
// too.
std::optional<StatsFile> ReadStatsFile(const std::string& path, std::string* error);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_STATS_FILE_H_

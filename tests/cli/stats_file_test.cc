// The statistics file between its writer (core/report/stats_report.h) and
// the CLI's reader (cli/stats_file.h), both naming keys through
// core/report/stats_schema.h: a real file of an Allocator on the simulated
// driver has exactly the schema's keys, and reads back value for value.
#include "cli/stats_file.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cli/report.h"
#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/report/stats_report.h"
#include "core/report/stats_schema.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim::cli {
namespace {

namespace k = stats_schema;

template <size_t N>
std::set<std::string> KeySet(const char* const (&keys)[N]) {
  return std::set<std::string>(std::begin(keys), std::end(keys));
}

std::set<std::string> KeysOf(const nlohmann::json& object) {
  std::set<std::string> keys;
  for (const auto& item : object.items()) keys.insert(item.key());
  return keys;
}

// A path in a directory of its own, removed at the test program's exit.
std::string TempPath(const std::string& name) {
  static auto* made = new std::vector<std::string>;
  if (made->empty()) {
    std::atexit([] {
      for (const std::string& dir : *made) std::filesystem::remove_all(dir);
    });
  }
  char tmpl[] = "/tmp/vmmshim-stats-file-test-XXXXXX";
  made->push_back(mkdtemp(tmpl));
  return made->back() + "/" + name;
}

class StatsFileTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2);
    MakeCurrent(0);
  }

  // An allocator whose figures are mostly not zero, so that a reader taking
  // one key for another reads a wrong value.
  void Exercise(ShimCore& shim) {
    Allocator& a = shim.allocator();
    MustAllocate(a, 256);
    const CUdeviceptr big = MustAllocate(a, 8 * kTestMiB);
    ASSERT_TRUE(a.Free(big).ok());
    MustAllocate(a, 8 * kTestMiB);  // a cache hit
    MustAllocate(a, 2 * kTestMiB);  // a miss
    absl::StatusOr<Allocator::Allocation> kv = a.Allocate(4 * kTestMiB, "kv");
    ASSERT_TRUE(kv.ok() && kv->served) << kv.status();
    ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());
    absl::StatusOr<size_t> paused = shim.pause().Pause(TagSelection::Only("kv"), /*keep_contents=*/false);
    ASSERT_TRUE(paused.ok() && *paused > 0) << paused.status();
    const CUstream stream = reinterpret_cast<CUstream>(0x51);
    absl::StatusOr<Allocator::Allocation> async = shim.stream_ordered().AllocateAsync(1 * kTestMiB, stream, false, nullptr);
    ASSERT_TRUE(async.ok() && async->served) << async.status();
    shim.counters().PassThrough(1000);
    shim.peer_enables().calls.fetch_add(1);
    shim.peer_enables().nanoseconds.fetch_add(1500);
  }
};

TEST_F(StatsFileTest, AWrittenFileHasExactlyTheSchemasKeys) {
  ShimCore shim(api_);
  Exercise(shim);
  const nlohmann::json doc = nlohmann::json::parse(StatsJson(shim.control(), 4242));
  EXPECT_EQ(KeysOf(doc), KeySet(k::kTopLevelKeys));
  EXPECT_EQ(KeysOf(doc.at(k::kTotals)), KeySet(k::totals::kKeys));
  // The dropped pause mapped scratch host memory on device 0.
  ASSERT_EQ(doc.at(k::kHostMemoryForPauses).size(), 1u);
  EXPECT_EQ(doc.at(k::kHostMemoryForPauses)[0].at("device"), 0);
  EXPECT_GT(doc.at(k::kHostMemoryForPauses)[0].at("scratch_bytes").get<uint64_t>(), 0u);
  ASSERT_FALSE(doc.at(k::kDevices).empty());
  bool any_peer = false;
  for (const nlohmann::json& d : doc.at(k::kDevices)) {
    EXPECT_EQ(KeysOf(d), KeySet(k::device::kKeys));
    EXPECT_EQ(KeysOf(d.at(k::device::kStreamOrdered)), KeySet(k::stream_ordered::kKeys));
    for (const nlohmann::json& p : d.at(k::device::kPeers)) {
      EXPECT_EQ(KeysOf(p), KeySet(k::peer::kKeys));
      any_peer = true;
    }
  }
  EXPECT_TRUE(any_peer) << "the file lists no peer: the peer keys went unchecked";
  for (const nlohmann::json& c : doc.at(k::kDriverCalls)) {
    EXPECT_EQ(KeysOf(c), KeySet(k::driver_call::kKeys));
  }
  EXPECT_EQ(doc.at(k::kSchemaVersion).get<int>(), k::kSchemaVersionNumber);
}

TEST_F(StatsFileTest, WhatWriteStatsFileWritesTheCliReadsBack) {
  ShimCore shim(api_);
  Exercise(shim);
  const std::string path = TempPath("stats.json");
  ASSERT_TRUE(WriteStatsFile(shim.control(), 4242, path).ok());
  std::string error;
  const std::optional<StatsFile> f = ReadStatsFile(path, &error);
  ASSERT_TRUE(f) << error;

  EXPECT_EQ(f->pid, 4242);
  EXPECT_FALSE(f->version.empty());
  EXPECT_NE(f->version, "an earlier build");
  EXPECT_EQ(f->schema_version, k::kSchemaVersionNumber);
  EXPECT_EQ(f->policy, shim.control().peer_policy().Describe());

  const AllocatorStats t = shim.control().GetStats();
  EXPECT_EQ(f->totals.served_allocations, t.served_allocations);
  EXPECT_EQ(f->totals.served_bytes, t.served_bytes);
  EXPECT_EQ(f->totals.passthrough_allocations, t.passthrough_allocations);
  EXPECT_EQ(f->totals.passthrough_bytes, t.passthrough_bytes);
  EXPECT_EQ(f->totals.frees, t.frees);
  EXPECT_EQ(f->totals.live_allocations, t.live_allocations);
  EXPECT_EQ(f->totals.live_bytes, t.live_bytes);
  EXPECT_EQ(f->totals.peak_physical_bytes, t.peak_handle_bytes);
  EXPECT_EQ(f->totals.stream_ordered_allocations, t.stream_ordered_allocations);
  EXPECT_EQ(f->totals.stream_ordered_reuses, t.stream_ordered_reuses);
  EXPECT_EQ(f->totals.free_synchronizes, t.free_synchronizes);
  EXPECT_EQ(f->totals.free_synchronizes_shared, t.free_synchronizes_shared);
  EXPECT_EQ(f->totals.peer_enable_calls, t.peer_enable_calls);
  EXPECT_DOUBLE_EQ(f->totals.peer_enable_seconds, t.peer_enable_seconds);
  EXPECT_EQ(f->totals.paused_bytes, t.paused_bytes);
  EXPECT_EQ(f->totals.peak_paused_bytes, t.peak_paused_bytes);
  // The scenario reaches these, so a key read as another shows.
  EXPECT_GT(t.passthrough_allocations, 0u);
  EXPECT_GT(t.stream_ordered_allocations, 0u);
  EXPECT_GT(t.peer_enable_calls, 0u);
  EXPECT_GT(t.paused_bytes, 0u);

  const std::vector<DeviceStats> devices = shim.control().GetStats().devices;
  ASSERT_EQ(f->devices.size(), devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceStats& d = devices[i];
    const StatsDevice& r = f->devices[i];
    SCOPED_TRACE("device " + std::to_string(d.device));
    EXPECT_EQ(r.device, d.device);
    EXPECT_EQ(r.allocations, d.allocations);
    EXPECT_EQ(r.bytes, d.bytes);
    EXPECT_EQ(r.live_bytes, d.live_bytes);
    EXPECT_EQ(r.peak_live_bytes, d.peak_live_bytes);
    EXPECT_EQ(r.physical_bytes, d.handle_bytes);
    EXPECT_EQ(r.peak_physical_bytes, d.peak_handle_bytes);
    EXPECT_EQ(r.set_access_calls, d.set_access_calls);
    EXPECT_EQ(r.cache_hits, d.cache_hits);
    EXPECT_EQ(r.cache_misses, d.cache_misses);
    EXPECT_EQ(r.cached_bytes, d.cached_bytes);
    EXPECT_EQ(r.ipc_exports, d.exports);
    EXPECT_EQ(r.context_releases, d.context_releases);
    EXPECT_EQ(r.paused_bytes, d.paused_bytes);
    EXPECT_EQ(r.peak_paused_bytes, d.peak_paused_bytes);
    EXPECT_EQ(r.compression, CompressionName(d.compression));
    EXPECT_EQ(r.stream_ordered.allocations, d.stream_ordered.allocations);
    EXPECT_EQ(r.stream_ordered.reuses, d.stream_ordered.reuses);
    EXPECT_EQ(r.stream_ordered.frees, d.stream_ordered.frees);
    EXPECT_EQ(r.stream_ordered.live_allocations, d.stream_ordered.live_allocations);
    EXPECT_EQ(r.stream_ordered.used_bytes, d.stream_ordered.used);
    EXPECT_EQ(r.stream_ordered.used_high_bytes, d.stream_ordered.used_high);
    EXPECT_EQ(r.stream_ordered.reserved_bytes, d.stream_ordered.reserved);
    EXPECT_EQ(r.stream_ordered.reserved_high_bytes, d.stream_ordered.reserved_high);
    EXPECT_EQ(r.stream_ordered.cached_bytes, d.stream_ordered.cached);
    EXPECT_EQ(r.stream_ordered.driver_queries, d.stream_ordered.driver_queries);
    std::vector<StatsPeer> want;
    for (size_t p = 0; p < d.peers.size(); ++p) {
      const PeerCounters& c = d.peers[p];
      if (c.grants == 0 && c.denials == 0 && c.peak_mapped_bytes == 0) continue;
      want.push_back({static_cast<int>(p), c.grants, c.denials, c.mapped_bytes,
                      c.peak_mapped_bytes});
    }
    ASSERT_EQ(r.peers.size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_EQ(r.peers[j].peer, want[j].peer);
      EXPECT_EQ(r.peers[j].grants, want[j].grants);
      EXPECT_EQ(r.peers[j].denials, want[j].denials);
      EXPECT_EQ(r.peers[j].mapped_bytes, want[j].mapped_bytes);
      EXPECT_EQ(r.peers[j].peak_mapped_bytes, want[j].peak_mapped_bytes);
    }
  }
  EXPECT_GT(devices[0].cache_hits, 0u);
  EXPECT_GT(devices[0].peers[1].grants, 0u);
  // The report prints from what was read.
  const std::string report = FormatReport(*f, path);
  EXPECT_NE(report.find("vmmshim statistics of pid 4242"), std::string::npos) << report;
  EXPECT_NE(report.find("policy: " + shim.control().peer_policy().Describe()), std::string::npos) << report;
}

// Every key read into its own field: a file whose every figure is distinct
// reads back with each figure in its place (the writer's scenario above
// leaves some figures zero).
TEST(StatsFileParse, EveryKeyLandsInItsField) {
  nlohmann::json totals, device, so, peer, call;
  uint64_t n = 1;
  for (const char* key : k::totals::kKeys) totals[key] = n++;
  for (const char* key : k::device::kKeys) device[key] = n++;
  for (const char* key : k::stream_ordered::kKeys) so[key] = n++;
  for (const char* key : k::peer::kKeys) peer[key] = n++;
  for (const char* key : k::driver_call::kKeys) call[key] = n++;
  device[k::device::kCompression] = "granted";
  device[k::device::kStreamOrdered] = so;
  device[k::device::kPeers] = nlohmann::json::array({peer});
  call[k::driver_call::kEntry] = "cuMemCreate";
  const nlohmann::json doc = {{k::kPid, 7},
                              {k::kVersion, "9.9.9"},
                              {k::kSchemaVersion, k::kSchemaVersionNumber},
                              {k::kPolicy, "all"},
                              {k::kTotals, totals},
                              {k::kDevices, nlohmann::json::array({device})},
                              {k::kDriverCalls, nlohmann::json::array({call})}};
  std::string error;
  const std::optional<StatsFile> f = ParseStatsJson(doc.dump(), "x.json", &error);
  ASSERT_TRUE(f) << error;
  auto v = [](const nlohmann::json& o, const char* key) { return o.at(key).get<uint64_t>(); };
  namespace kt = k::totals;
  EXPECT_EQ(f->totals.served_allocations, v(totals, kt::kServedAllocations));
  EXPECT_EQ(f->totals.served_bytes, v(totals, kt::kServedBytes));
  EXPECT_EQ(f->totals.passthrough_allocations, v(totals, kt::kPassthroughAllocations));
  EXPECT_EQ(f->totals.passthrough_bytes, v(totals, kt::kPassthroughBytes));
  EXPECT_EQ(f->totals.frees, v(totals, kt::kFrees));
  EXPECT_EQ(f->totals.live_allocations, v(totals, kt::kLiveAllocations));
  EXPECT_EQ(f->totals.live_bytes, v(totals, kt::kLiveBytes));
  EXPECT_EQ(f->totals.peak_physical_bytes, v(totals, kt::kPeakPhysicalBytes));
  EXPECT_EQ(f->totals.stream_ordered_allocations, v(totals, kt::kStreamOrderedAllocations));
  EXPECT_EQ(f->totals.stream_ordered_reuses, v(totals, kt::kStreamOrderedReuses));
  EXPECT_EQ(f->totals.free_synchronizes, v(totals, kt::kFreeSynchronizes));
  EXPECT_EQ(f->totals.free_synchronizes_shared, v(totals, kt::kFreeSynchronizesShared));
  EXPECT_EQ(f->totals.peer_enable_calls, v(totals, kt::kPeerEnableCalls));
  EXPECT_EQ(f->totals.peer_enable_seconds, v(totals, kt::kPeerEnableSeconds));
  EXPECT_EQ(f->totals.paused_bytes, v(totals, kt::kPausedBytes));
  EXPECT_EQ(f->totals.peak_paused_bytes, v(totals, kt::kPeakPausedBytes));
  ASSERT_EQ(f->devices.size(), 1u);
  const StatsDevice& d = f->devices[0];
  namespace kd = k::device;
  EXPECT_EQ(static_cast<uint64_t>(d.device), v(device, kd::kDevice));
  EXPECT_EQ(d.allocations, v(device, kd::kAllocations));
  EXPECT_EQ(d.bytes, v(device, kd::kBytes));
  EXPECT_EQ(d.live_bytes, v(device, kd::kLiveBytes));
  EXPECT_EQ(d.peak_live_bytes, v(device, kd::kPeakLiveBytes));
  EXPECT_EQ(d.physical_bytes, v(device, kd::kPhysicalBytes));
  EXPECT_EQ(d.peak_physical_bytes, v(device, kd::kPeakPhysicalBytes));
  EXPECT_EQ(d.set_access_calls, v(device, kd::kSetAccessCalls));
  EXPECT_EQ(d.cache_hits, v(device, kd::kCacheHits));
  EXPECT_EQ(d.cache_misses, v(device, kd::kCacheMisses));
  EXPECT_EQ(d.cached_bytes, v(device, kd::kCachedBytes));
  EXPECT_EQ(d.ipc_exports, v(device, kd::kIpcExports));
  EXPECT_EQ(d.context_releases, v(device, kd::kContextReleases));
  EXPECT_EQ(d.paused_bytes, v(device, kd::kPausedBytes));
  EXPECT_EQ(d.peak_paused_bytes, v(device, kd::kPeakPausedBytes));
  EXPECT_EQ(d.compression, "granted");
  namespace ks = k::stream_ordered;
  EXPECT_EQ(d.stream_ordered.allocations, v(so, ks::kAllocations));
  EXPECT_EQ(d.stream_ordered.reuses, v(so, ks::kReuses));
  EXPECT_EQ(d.stream_ordered.frees, v(so, ks::kFrees));
  EXPECT_EQ(d.stream_ordered.live_allocations, v(so, ks::kLiveAllocations));
  EXPECT_EQ(d.stream_ordered.used_bytes, v(so, ks::kUsedBytes));
  EXPECT_EQ(d.stream_ordered.used_high_bytes, v(so, ks::kUsedHighBytes));
  EXPECT_EQ(d.stream_ordered.reserved_bytes, v(so, ks::kReservedBytes));
  EXPECT_EQ(d.stream_ordered.reserved_high_bytes, v(so, ks::kReservedHighBytes));
  EXPECT_EQ(d.stream_ordered.cached_bytes, v(so, ks::kCachedBytes));
  EXPECT_EQ(d.stream_ordered.driver_queries, v(so, ks::kDriverQueries));
  ASSERT_EQ(d.peers.size(), 1u);
  namespace kp = k::peer;
  EXPECT_EQ(static_cast<uint64_t>(d.peers[0].peer), v(peer, kp::kPeer));
  EXPECT_EQ(d.peers[0].grants, v(peer, kp::kGrants));
  EXPECT_EQ(d.peers[0].denials, v(peer, kp::kDenials));
  EXPECT_EQ(d.peers[0].mapped_bytes, v(peer, kp::kMappedBytes));
  EXPECT_EQ(d.peers[0].peak_mapped_bytes, v(peer, kp::kPeakMappedBytes));
  ASSERT_EQ(f->driver_calls.size(), 1u);
  EXPECT_EQ(f->driver_calls[0].entry, "cuMemCreate");
  EXPECT_EQ(f->driver_calls[0].calls, v(call, k::driver_call::kCalls));
  EXPECT_EQ(f->driver_calls[0].seconds, v(call, k::driver_call::kSeconds));
  EXPECT_EQ(f->pid, 7);
  EXPECT_EQ(f->version, "9.9.9");
  EXPECT_EQ(f->policy, "all");
}

TEST(StatsFileParse, RefusesALaterSchemaAndWhatIsNotAStatisticsFile) {
  std::string error;
  const nlohmann::json later = {{k::kSchemaVersion, k::kSchemaVersionNumber + 1}};
  EXPECT_FALSE(ParseStatsJson(later.dump(), "later.json", &error));
  EXPECT_NE(error.find("later.json has statistics schema version"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(ParseStatsJson("not json", "bad.json", &error));
  EXPECT_NE(error.find("bad.json is not a vmmshim statistics file"), std::string::npos) << error;
  error.clear();
  const nlohmann::json no_totals = {{k::kPid, 1}, {k::kPolicy, "all"}};
  EXPECT_FALSE(ParseStatsJson(no_totals.dump(), "partial.json", &error));
  EXPECT_NE(error.find("partial.json is not a vmmshim statistics file"), std::string::npos)
      << error;
  // What is missing or wrong, by its path, in the reader's words.
  EXPECT_NE(error.find("it has no 'totals'"), std::string::npos) << error;
  EXPECT_EQ(error.find("json.exception"), std::string::npos) << error;
  error.clear();
  const nlohmann::json bad_device = {{k::kPid, 1},
                                     {k::kPolicy, "all"},
                                     {k::kTotals, nlohmann::json::object()},
                                     {k::kDevices, 3}};
  EXPECT_FALSE(ParseStatsJson(bad_device.dump(), "t.json", &error));
  EXPECT_NE(error.find("it has no 'totals.served_allocations'"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(ParseStatsJson("{\"pid\": \"one\"}", "p.json", &error));
  EXPECT_NE(error.find("'pid' is a string, not a number"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(ParseStatsJson("not json", "bad.json", &error));
  EXPECT_NE(error.find("it is not JSON"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(ReadStatsFile("/nonexistent-vmmshim/stats.json", &error));
  EXPECT_NE(error.find("cannot open '/nonexistent-vmmshim/stats.json'"), std::string::npos);
}

}  // namespace
}  // namespace vmmshim::cli

namespace vmmshim::cli {
namespace {

// `vmmshim report FILE...`: one row per process, the totals added up, under
// 100 columns; the JSON holds the same figures.
TEST(ProcessesReport, OneRowPerProcessAndTheTotals) {
  std::vector<ProcessStats> processes(2);
  processes[0].path = "/tmp/run.101.json";
  processes[0].stats.pid = 101;
  processes[0].stats.version = "0.1.0";
  processes[0].stats.policy = "min-size (allocations of at least 1048576 bytes ...)";
  processes[0].stats.totals.served_allocations = 10;
  processes[0].stats.totals.served_bytes = 3 << 20;
  processes[0].stats.totals.peak_physical_bytes = 4 << 20;
  StatsDevice device;
  device.device = 0;
  device.peers.push_back(StatsPeer{1, 3, 7, 0, 2 << 20});
  processes[0].stats.devices.push_back(device);
  processes[1].path = "/tmp/run.102.json";
  processes[1].stats.pid = 102;
  processes[1].stats.version = "0.1.0";
  processes[1].stats.policy = "all";
  processes[1].stats.totals.served_allocations = 5;
  processes[1].stats.totals.served_bytes = 1 << 20;
  processes[1].stats.totals.peak_physical_bytes = 2 << 20;
  processes[1].stats.totals.live_allocations = 2;

  const std::string text = FormatProcesses(processes);
  EXPECT_NE(text.find("vmmshim statistics of 2 processes"), std::string::npos) << text;
  size_t rows = 0;
  for (size_t at = 0, end; at < text.size(); at = end + 1) {
    end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    EXPECT_LE(line.size(), 100u) << line;
    if (line.rfind("101 ", 0) == 0) {
      ++rows;
      EXPECT_NE(line.find("3.00 MiB"), std::string::npos) << line;
    }
    if (line.rfind("total ", 0) == 0) {
      ++rows;
      EXPECT_NE(line.find(" 15 "), std::string::npos) << line;       // served
      EXPECT_NE(line.find("4.00 MiB"), std::string::npos) << line;   // bytes
      EXPECT_NE(line.find("6.00 MiB"), std::string::npos) << line;   // peak physical
      EXPECT_NE(line.find("2.00 MiB"), std::string::npos) << line;   // peer-mapped
    }
  }
  EXPECT_EQ(rows, 2u) << text;
  EXPECT_NE(text.find("- 101: /tmp/run.101.json (vmmshim 0.1.0, policy min-size)"),
            std::string::npos)
      << text;

  const nlohmann::json doc = nlohmann::json::parse(ProcessesJson(processes));
  ASSERT_EQ(doc["processes"].size(), 2u);
  EXPECT_EQ(doc["processes"][1]["pid"], 102);
  EXPECT_EQ(doc["processes"][0]["figures"]["grants"], 3);
  EXPECT_EQ(doc["processes"][0]["figures"]["denials"], 7);
  EXPECT_EQ(doc["totals"]["served_allocations"], 15);
  EXPECT_EQ(doc["totals"]["live_allocations"], 2);
  EXPECT_EQ(doc["totals"]["peak_physical_bytes"], 6 << 20);
}

}  // namespace
}  // namespace vmmshim::cli

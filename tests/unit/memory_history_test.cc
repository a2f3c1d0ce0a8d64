// The memory history and what reads it (core/history/, core/report/
// memory_snapshot.h, oom_report.h, pickle_writer.h): events of every kind
// recorded by the heaps on the simulated driver, segments tiled by their
// parts with the caller library of each allocation, the pickle's bytes,
// the ring of events, caller names, the out-of-memory report, and a
// snapshot that cannot be written.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/driver/cu_status.h"
#include "core/history/caller_library.h"
#include "core/history/memory_history.h"
#include "core/report/memory_snapshot.h"
#include "core/report/oom_report.h"
#include "core/report/pickle_writer.h"
#include "gtest/gtest.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

std::vector<HistoryAction> Actions(const MemoryHistory& h) {
  std::vector<HistoryAction> out;
  for (const HistoryEvent& e : h.Copy().events) out.push_back(e.action);
  return out;
}

int Count(const std::vector<HistoryAction>& v, HistoryAction a) {
  int n = 0;
  for (HistoryAction x : v) n += x == a;
  return n;
}

class MemoryHistoryTest : public SimTest {
 protected:
  void SetUp() override {
    StartSim(2, 256 * kMiB);
    MakeCurrent(0);
  }
  AllocatorOptions WithHistory() {
    AllocatorOptions o;
    o.history = &history_;
    return o;
  }
  MemoryHistory history_;
};

TEST_F(MemoryHistoryTest, HeapsRecordSegmentsPausesAndPeerDecisions) {
  history_.Enable(1000, 0);
  AllocatorOptions o = WithHistory();
  o.peer_policy.kind = PeerPolicy::Kind::kMinSize;
  o.peer_policy.min_bytes = kMiB;
  ShimCore shim(api_, o);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> large = a.Allocate(8 * kMiB, "kv", 3);
  absl::StatusOr<Allocator::Allocation> small = a.Allocate(4096, "", 4);
  ASSERT_TRUE(large.ok() && small.ok());
  EXPECT_EQ(large->device, 0);
  std::vector<HistoryAction> v = Actions(history_);
  EXPECT_EQ(Count(v, HistoryAction::kSegmentAlloc), 2);  // a large block and a granule

  // Segments: the large block is one live part; the granule one live part
  // and its free rest; each part keeps its caller library.
  std::vector<SegmentInfo> segments = shim.control().Segments();
  ASSERT_EQ(segments.size(), 2u);
  for (const SegmentInfo& s : segments) {
    uint64_t tiled = 0;
    for (const SegmentPart& p : s.parts) {
      EXPECT_EQ(p.offset, tiled);
      tiled += p.size;
    }
    EXPECT_EQ(tiled, s.size);
    if (s.address == large->ptr) {
      EXPECT_EQ(s.tag, "kv");
      ASSERT_EQ(s.parts.size(), 1u);
      EXPECT_EQ(s.parts[0].requested, 8 * kMiB);
      EXPECT_EQ(s.parts[0].origin, 3);
    } else {
      EXPECT_TRUE(s.packed);
      ASSERT_EQ(s.parts.size(), 2u);
      EXPECT_EQ(s.parts[0].requested, 4096u);
      EXPECT_EQ(s.parts[0].origin, 4);
      EXPECT_FALSE(s.parts[1].live);
    }
  }

  // Peer enable: the 8 MiB allocation granted, the 4 KiB one denied. Nested
  // calls record the pair's first enable and last disable only.
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());
  ASSERT_TRUE(shim.peers().EnablePeer(1, 0).ok());
  ASSERT_TRUE(shim.peers().DisablePeer(1, 0).ok());
  ASSERT_TRUE(shim.peers().DisablePeer(1, 0).ok());
  // Pause and resume of the tag: its block unmapped, then mapped.
  ASSERT_TRUE(shim.pause().Pause(TagSelection::Only("kv"), true).ok());
  EXPECT_TRUE(shim.control().Segments()[0].paused || shim.control().Segments()[1].paused);
  ASSERT_TRUE(shim.pause().Resume(TagSelection::Only("kv")).ok());
  // A free keeps the large block cached; the trim releases it.
  ASSERT_TRUE(a.Free(large->ptr).ok());
  shim.control().Trim(-1);
  v = Actions(history_);
  EXPECT_EQ(Count(v, HistoryAction::kPeerEnable), 1);
  EXPECT_EQ(Count(v, HistoryAction::kPeerDisable), 1);
  EXPECT_EQ(Count(v, HistoryAction::kPeerGrant), 1);
  EXPECT_EQ(Count(v, HistoryAction::kPeerDeny), 1);
  EXPECT_EQ(Count(v, HistoryAction::kSegmentUnmap), 1);
  EXPECT_EQ(Count(v, HistoryAction::kSegmentMap), 1);
  EXPECT_EQ(Count(v, HistoryAction::kSegmentFree), 1);
  for (const HistoryEvent& e : history_.Copy().events) {
    if (e.action == HistoryAction::kPeerDeny) {
      EXPECT_EQ(e.device, 0);
      EXPECT_EQ(e.peer, 1);
      EXPECT_EQ(e.size, 4096u);
    }
  }
  ASSERT_TRUE(a.Free(small->ptr).ok());
}

TEST_F(MemoryHistoryTest, NothingIsRecordedWhileDisabled) {
  ShimCore shim(api_, WithHistory());
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> p = a.Allocate(8 * kMiB);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(a.Free(p->ptr).ok());
  shim.control().Trim(-1);
  EXPECT_TRUE(history_.Copy().events.empty());
}

TEST(MemoryHistory, KeepsTheNewestEventsAndCountsTheDropped) {
  MemoryHistory h;
  h.Enable(3, 0);
  for (int i = 1; i <= 5; ++i) {
    HistoryRecord r;
    r.addr = i;
    r.tag = i % 2 ? "odd" : "";
    h.Record(r);
  }
  MemoryHistory::Contents c = h.Copy();
  ASSERT_EQ(c.events.size(), 3u);
  EXPECT_EQ(c.events[0].addr, 3u);  // oldest first
  EXPECT_EQ(c.events[2].addr, 5u);
  EXPECT_EQ(c.dropped, 2u);
  EXPECT_EQ(c.tags[c.events[0].tag], "odd");
  EXPECT_EQ(c.events[1].tag, 0u);
  // Shrinking keeps the newest, in order.
  h.Enable(2, 0);
  c = h.Copy();
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.events[0].addr, 4u);
  EXPECT_EQ(c.dropped, 3u);
  // The same stack gets the same id.
  void* frames[] = {reinterpret_cast<void*>(0x10), reinterpret_cast<void*>(0x20)};
  const uint32_t id = h.InternStack(frames);
  EXPECT_NE(id, 0u);
  EXPECT_EQ(h.InternStack(frames), id);
  h.Disable();
  h.Record(HistoryRecord{});
  EXPECT_EQ(h.Copy().events.size(), 2u);
}

TEST(CallerLibraries, NamesObjectsByFileAndPackage) {
  EXPECT_EQ(CallerLibraries::NameOfPath("/usr/lib/libcublas.so.13.0.2"), "libcublas");
  EXPECT_EQ(CallerLibraries::NameOfPath("/opt/app/bin/alloc_bench"), "alloc_bench");
  EXPECT_EQ(CallerLibraries::NameOfPath(
                "/venv/lib/python3.12/site-packages/cupy_backends/cuda/api/"
                "runtime.cpython-312-x86_64-linux-gnu.so"),
            "cupy_backends.cuda.api.runtime");
  EXPECT_EQ(CallerLibraries::NameOfPath(
                "/root/.pyenv/versions/3.11.7/lib/python3.11/lib-dynload/"
                "zlib.cpython-311-x86_64-linux-gnu.so"),
            "zlib");
  EXPECT_EQ(CallerLibraries::NameOfPath(""), "unknown");
  EXPECT_TRUE(CallerLibraries::IsRuntimeLibrary("libcudart"));
  EXPECT_TRUE(CallerLibraries::IsRuntimeLibrary("libvmmshim"));
  EXPECT_FALSE(CallerLibraries::IsRuntimeLibrary("libcublas"));
}

__attribute__((noinline)) uint16_t ResolveHere(CallerLibraries& c) {
  int local = 0;
  uint16_t id = c.Resolve(__builtin_return_address(0), &local);
  __asm__ volatile("" ::: "memory");
  return id;
}

TEST(CallerLibraries, ResolvesTheCallersObjectTheSameEachTime) {
  CallerLibraries c;
  const uint16_t id = ResolveHere(c);
  EXPECT_EQ(c.Name(id), "vmmshim_unit_tests");
  EXPECT_EQ(ResolveHere(c), id);  // the second time from the return-address cache
  EXPECT_EQ(c.Name(CallerLibraries::kUnknown), "unknown");
  EXPECT_EQ(c.Name(60000), "unknown");
  int local = 0;
  EXPECT_EQ(c.Resolve(reinterpret_cast<void*>(16), &local), CallerLibraries::kUnknown);
}

// Python's pickle opcodes (Lib/pickletools.py), checked byte for byte.
TEST(PickleWriter, WritesProtocolTwoOpcodes) {
  PickleWriter w;
  w.BeginDict();
  w.Key("a");
  w.BeginList();
  w.Int(7);
  w.Int(-1);
  w.UInt(0x200000000000);
  w.Bool(true);
  w.None();
  w.Pair(0, 300);
  w.EndList();
  w.EndDict();
  const std::string p = w.Finish();
  const std::string want = std::string("\x80\x02}(X\x01\x00\x00\x00" "a](K\x07J\xff\xff\xff\xff", 19) +
                           std::string("\x8a\x06\x00\x00\x00\x00\x00\x20", 8) + "\x88N" +
                           std::string("K\x00J\x2c\x01\x00\x00\x86", 8) + "eu.";
  EXPECT_EQ(p, want);
}

TEST(PickleWriter, LargeIntegersFloatsAndInvalidUtf8) {
  PickleWriter w;
  w.UInt(~uint64_t{0});
  w.Float(1.5);
  w.String("a\xff" "b");
  const std::string p = w.Finish();
  EXPECT_EQ(p.substr(2, 11), std::string("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00", 11));
  EXPECT_EQ(p.substr(13, 9), std::string("G\x3f\xf8\x00\x00\x00\x00\x00\x00", 9));
  EXPECT_EQ(p.substr(22), std::string("X\x05\x00\x00\x00" "a\xef\xbf\xbd" "b.", 11));
}

TEST_F(MemoryHistoryTest, OutOfMemoryReportNamesTheLargestHolders) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  absl::StatusOr<Allocator::Allocation> kv = a.Allocate(64 * kMiB, "kv");
  absl::StatusOr<Allocator::Allocation> w = a.Allocate(16 * kMiB, "");
  ASSERT_TRUE(kv.ok() && w.ok());
  OomRequest r;
  r.device = 0;
  r.bytes = 512 * kMiB;
  r.entry_point = "cuMemAlloc";
  r.device_free = 100 * kMiB;
  r.device_total = 256 * kMiB;
  const std::string text = OomReport(shim.control(), nullptr, r, 1);
  EXPECT_NE(text.find("out of memory: cuMemAlloc of 512.0 MiB on device 0 (untagged, from "
                      "unknown)"), std::string::npos) << text;
  EXPECT_NE(text.find("the driver reports 100.0 MiB free of 256.0 MiB"), std::string::npos);
  EXPECT_NE(text.find("by tag: kv 64.0 MiB, (untagged) 16.0 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("64.0 MiB  tag kv  unknown"), std::string::npos) << text;
  EXPECT_EQ(text.find("16.0 MiB  untagged"), std::string::npos) << text;  // only the largest
  EXPECT_EQ(HumanBytes(100), "100 bytes");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  ASSERT_TRUE(a.Free(kv->ptr).ok());
  ASSERT_TRUE(a.Free(w->ptr).ok());
}

TEST_F(MemoryHistoryTest, SnapshotThatCannotBeWrittenLeavesNoFile) {
  ShimCore shim(api_);
  Allocator& a = shim.allocator();
  SnapshotSources s;
  s.control = &shim.control();
  absl::Status st = WriteMemorySnapshot(s, "/nonexistent-dir/s.pickle");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("'/nonexistent-dir/s.pickle'"), std::string::npos) << st;
  EXPECT_EQ(WriteMemorySnapshot(s, "").code(), absl::StatusCode::kInvalidArgument);

  // A write that fails midway (as on a full disk): a file size limit of
  // 100 bytes in a child, with SIGXFSZ ignored so that write() fails.
  absl::StatusOr<Allocator::Allocation> p = a.Allocate(4096);
  ASSERT_TRUE(p.ok());
  char dir[] = "/tmp/vmmshim-snapshot-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/s.pickle";
  const pid_t child = fork();
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{100, 100};
    setrlimit(RLIMIT_FSIZE, &limit);
    absl::Status written = WriteMemorySnapshot(s, path);
    _exit(written.code() == absl::StatusCode::kUnavailable &&
                  written.message().find("write: File too large") != absl::string_view::npos
              ? 0
              : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NE(access(path.c_str(), F_OK), 0);                    // no partial snapshot
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the temporary file was left behind";
  ASSERT_TRUE(WriteMemorySnapshot(s, path).ok());              // without the limit: written
  EXPECT_EQ(access(path.c_str(), F_OK), 0);
  unlink(path.c_str());
  rmdir(dir);
  ASSERT_TRUE(a.Free(p->ptr).ok());
}

}  // namespace
}  // namespace vmmshim

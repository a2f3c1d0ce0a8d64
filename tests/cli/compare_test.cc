// cli/compare: the pieces of `vmmshim compare` that decide what a user
// reads (policy parsing, the environments of native and policy runs, the
// output check, adding up statistics files, medians) and the child runner
// (exit codes, signals, time limits, exec failures). The whole command runs
// end to end on the simulated driver in tests/e2e/compare.sh.
// (The statistics file itself: stats_file_test.cc.)
#include "cli/compare/compare.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <filesystem>
#include <vector>

#include "cli/compare/child_process.h"
#include "cli/compare/internal.h"
#include "cli/compare/device_memory.h"
#include "cli/format.h"
#include "core/report/stats_schema.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace vmmshim::compare {
namespace {

// The directories TempDir made, removed at exit (by the test process, not
// by a child that forked from it).
std::vector<std::string>& MadeDirs() {
  static auto* dirs = new std::vector<std::string>;
  return *dirs;
}
pid_t g_maker = 0;

void RemoveMadeDirs() {
  if (getpid() != g_maker) return;
  for (const std::string& dir : MadeDirs()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
}

std::string TempDir() {
  char tmpl[] = "/tmp/vmmshim-compare-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  if (g_maker == 0) {
    g_maker = getpid();
    std::atexit(&RemoveMadeDirs);
  }
  MadeDirs().push_back(dir);
  return dir;
}

bool Has(const std::vector<std::string>& env, const std::string& entry) {
  return std::find(env.begin(), env.end(), entry) != env.end();
}

bool HasName(const std::vector<std::string>& env, const std::string& name) {
  for (const std::string& e : env) {
    if (e.compare(0, name.size() + 1, name + "=") == 0) return true;
  }
  return false;
}

TEST(ComparePolicies, ParsesEveryFormAsTheShimDoes) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/r.toml") << "default = \"deny\"\n[[rule]]\ntag = \"kv\"\naction = \"allow\"\n";
  // A relative rules path becomes absolute: the program may change directory.
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(chdir(dir.c_str()), 0);
  std::string error;
  auto specs = ParsePolicies("all,none,min-size:1M,min-size:64KiB,min-size:512B,rules:r.toml",
                             &error);
  ASSERT_EQ(chdir(cwd), 0);
  ASSERT_TRUE(specs) << error;
  ASSERT_EQ(specs->size(), 6u);
  EXPECT_EQ((*specs)[0].policy, "all");
  EXPECT_EQ((*specs)[2].policy, "min-size");
  EXPECT_EQ((*specs)[2].min_bytes, "1M");
  EXPECT_EQ((*specs)[2].label, "min-size:1M");
  EXPECT_EQ((*specs)[3].min_bytes, "64KiB");
  EXPECT_EQ((*specs)[4].min_bytes, "512B");
  EXPECT_EQ((*specs)[5].rules_file, dir + "/r.toml");
  EXPECT_EQ((*specs)[5].label, "rules:r.toml");
}

TEST(ComparePolicies, RefusesWhatTheShimWouldRefuseNamingTheItem) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/bad.toml") << "[[rule]]\nmin_size = \"lots\"\naction = \"allow\"\n";
  struct Case {
    std::string list;
    std::string message;
  } cases[] = {
      {"all,bogus", "'bogus' is not one of all, none, min-size:BYTES, rules:FILE"},
      {"min-size", "min-size needs a byte count"},
      {"min-size:12 parsecs", "min-size needs a byte count"},
      {"min-size:99999999999T", "min-size needs a byte count"},  // overflows, as in the shim
      {"none:1M", "none takes no argument"},
      {"rules:/nonexistent/rules.toml", "/nonexistent/rules.toml: cannot open the rules file"},
      {"rules:" + dir, dir + ": not a regular file"},
      {"rules:" + dir + "/bad.toml", "bad.toml:2: min_size must be a byte count"},
      {"rules", "rules needs a rules file"},
      {"all,all", "'all' is listed twice"},
      {"", "no policy given"},
  };
  for (const Case& c : cases) {
    std::string error;
    EXPECT_FALSE(ParsePolicies(c.list, &error)) << c.list;
    EXPECT_NE(error.find(c.message), std::string::npos) << c.list << ": " << error;
  }
}

TEST(CompareEnvironment, NativeRunsHaveNoShimAtAll) {
  const std::vector<std::string> base = {
      "PATH=/bin", "VMMSHIM_PEER_POLICY=none", "VMMSHIM_CACHE_LIMIT=0",
      "LD_PRELOAD=/opt/libfoo.so /x/lib/libvmmshim.so:/opt/libbar.so"};
  const std::vector<std::string> env = NativeEnvironment(base);
  EXPECT_TRUE(Has(env, "PATH=/bin"));
  EXPECT_FALSE(HasName(env, "VMMSHIM_PEER_POLICY"));
  EXPECT_FALSE(HasName(env, "VMMSHIM_CACHE_LIMIT"));
  EXPECT_TRUE(Has(env, "LD_PRELOAD=/opt/libfoo.so /opt/libbar.so"));
  EXPECT_FALSE(HasName(NativeEnvironment({"LD_PRELOAD=libvmmshim.so"}), "LD_PRELOAD"));
}

TEST(CompareEnvironment, PolicyRunsSetTheirOwnVariablesAndKeepTheCallersOthers) {
  PolicySpec spec{"min-size:1M", "min-size", "1M", ""};
  const std::vector<std::string> env = PolicyEnvironment(
      {"HOME=/root", "VMMSHIM_PEER_POLICY=none", "VMMSHIM_CONFIG=/x.toml",
       "VMMSHIM_CACHE_LIMIT=0", "VMMSHIM_ENABLE=0", "LD_PRELOAD=/opt/libfoo.so"},
      "/lib/libvmmshim.so", spec, "/o/s.%p.json", "/o/l.%p.log");
  EXPECT_TRUE(Has(env, "HOME=/root"));
  EXPECT_TRUE(Has(env, "VMMSHIM_CACHE_LIMIT=0"));  // a setting of the user's, kept
  EXPECT_TRUE(Has(env, "VMMSHIM_PEER_POLICY=min-size"));
  EXPECT_TRUE(Has(env, "VMMSHIM_PEER_MIN_BYTES=1M"));
  EXPECT_FALSE(HasName(env, "VMMSHIM_CONFIG"));  // would select another policy
  EXPECT_FALSE(HasName(env, "VMMSHIM_ENABLE"));  // would switch the shim off
  EXPECT_TRUE(Has(env, "LD_PRELOAD=/lib/libvmmshim.so /opt/libfoo.so"));
  EXPECT_TRUE(Has(env, "VMMSHIM_STATS_FILE=/o/s.%p.json"));
  EXPECT_TRUE(Has(env, "VMMSHIM_LOG_FILE=/o/l.%p.log"));
  EXPECT_TRUE(Has(env, "VMMSHIM_LOG_LEVEL=info"));
  size_t policies = 0;
  for (const std::string& e : env) policies += e.rfind("VMMSHIM_PEER_POLICY=", 0) == 0;
  EXPECT_EQ(policies, 1u);
}

std::string Difference(const std::string& want, const std::string& got,
                       const std::optional<std::string>& regex) {
  std::string error;
  std::optional<LineFilter> f = LineFilter::Make(regex, &error);
  EXPECT_TRUE(f) << error;
  return LinesDifference(f->Lines(want), f->Lines(got), f->filters());
}

TEST(CompareOutput, WholeOutputOrTheCheckedLines) {
  const std::string native = "step 1 loss 0.5\ntime 12 ms\nresult sha 1234\n";
  EXPECT_EQ(Difference(native, native, std::nullopt), "");
  const std::string slower = "step 1 loss 0.5\ntime 19 ms\nresult sha 1234\n";
  EXPECT_EQ(Difference(native, slower, std::nullopt),
            "line 2: 'time 19 ms' instead of 'time 12 ms'");
  EXPECT_EQ(Difference(native, slower, "^(step|result)"), "");
  EXPECT_EQ(Difference(native, "step 1 loss 0.5\nresult sha 9999\n", "^(step|result)"),
            "checked line 2: 'result sha 9999' instead of 'result sha 1234'");
  EXPECT_EQ(Difference(native, "step 1 loss 0.5\n", std::nullopt), "1 lines instead of 3");
  EXPECT_EQ(Difference("a\r\nb\n", "a\nb", std::nullopt), "");  // line ends alone
  std::string error;
  EXPECT_EQ(LineFilter::Make("x=", &error)->Lines("x=1\ny=2\nx=3\n"),
            (std::vector<std::string>{"x=1", "x=3"}));
  // A long line is shown around where it differs, not cut before it.
  const std::string head(150, 'a');
  const std::string diff = Difference(head + "1 tail\n", head + "2 tail\n", std::nullopt);
  EXPECT_NE(diff.find("a2 tail' instead of '...aaa"), std::string::npos) << diff;
  EXPECT_NE(diff.find("a1 tail'"), std::string::npos) << diff;
}

TEST(CompareOutput, LinesThatVaryBetweenNativeRunsAreLeftOut) {
  const std::vector<std::string> native = {"time: 12 ms", "result 42"};
  // Without native runs to learn from, a timing line fails a policy.
  EXPECT_EQ(LinesDifference(native, {"time: 99 ms", "result 42"}, false),
            "line 1: 'time: 99 ms' instead of 'time: 12 ms'");
  VaryingLines varying(native);
  varying.Learn({"time: 15 ms", "result 42"}, /*warmup=*/true);
  varying.Learn({"time: 9 ms", "result 42"}, /*warmup=*/false);
  varying.Learn({"time: 12 ms", "result 42"}, /*warmup=*/false);
  const std::vector<size_t> ignored = varying.Positions();
  EXPECT_EQ(ignored, std::vector<size_t>{0});
  EXPECT_EQ(varying.Texts(0),
            (std::vector<std::string>{"time: 12 ms", "time: 15 ms", "time: 9 ms"}));
  EXPECT_EQ(varying.runs(), 4);
  EXPECT_EQ(varying.caveat(), "");
  EXPECT_EQ(LinesDifference(native, {"time: 99 ms", "result 42"}, false, ignored), "");
  // A stable line, the number of lines: still caught.
  EXPECT_EQ(LinesDifference(native, {"time: 99 ms", "result 41"}, false, ignored),
            "line 2: 'result 41' instead of 'result 42'");
  EXPECT_EQ(LinesDifference(native, {"time: 99 ms"}, false, ignored), "1 lines instead of 2");
  EXPECT_EQ(LinesDifference(native, {"time: 99 ms", "result 42", "more"}, false, ignored),
            "3 lines instead of 2");
}

TEST(CompareOutput, NativeRunsOfAnotherLengthAreNotLinedUp) {
  const std::vector<std::string> native = {"a", "t=1"};
  // A warm-up's first-run line: learnt from the counted runs only.
  VaryingLines warm(native);
  warm.Learn({"compiling", "a", "t=2"}, /*warmup=*/true);
  warm.Learn({"a", "t=3"}, /*warmup=*/false);
  EXPECT_EQ(warm.Positions(), std::vector<size_t>{1});
  EXPECT_EQ(warm.runs(), 2);
  EXPECT_NE(warm.caveat().find("a warm-up native run printed 3 lines, the counted ones 2"),
            std::string::npos)
      << warm.caveat();
  // Counted runs that disagree: nothing left out.
  VaryingLines counted(native);
  counted.Learn({"b", "t=2"}, /*warmup=*/false);
  counted.Learn({"a", "t=3", "extra"}, /*warmup=*/false);
  EXPECT_TRUE(counted.Positions().empty());
  EXPECT_EQ(counted.runs(), 1);
  EXPECT_NE(counted.caveat().find("different numbers of lines (2, 3)"), std::string::npos)
      << counted.caveat();
  EXPECT_NE(counted.caveat().find("no line left out"), std::string::npos);
  // One native run: nothing to learn, nothing left out.
  VaryingLines one(native);
  EXPECT_TRUE(one.Positions().empty());
  EXPECT_EQ(one.runs(), 1);
  EXPECT_EQ(one.caveat(), "");
}

TEST(CompareOutput, LongLinesAndHeavyPatternsAreSafe) {
  // std::regex recursed once per character and crashed on 50,000; POSIX
  // regexec does not.
  const std::string line(200000, 'a');
  for (const char* re : {".*z", "(a|b)*c", "^(a+)+$"}) {
    std::string error;
    std::optional<LineFilter> f = LineFilter::Make(std::string(re), &error);
    ASSERT_TRUE(f) << error;
    EXPECT_EQ(f->Lines(line + "\n").size(), std::string(re) == "^(a+)+$" ? 1u : 0u) << re;
  }
  std::string error;
  EXPECT_FALSE(LineFilter::Make(std::string("("), &error));
  EXPECT_NE(error.find("'(' is not a regular expression (POSIX extended, as grep -E)"),
            std::string::npos)
      << error;
}

// A statistics file with every key of the schema, zero but for those given.
std::string StatsText(uint64_t served, uint64_t denials) {
  namespace k = stats_schema;
  nlohmann::json totals, device, peer;
  for (const char* key : k::totals::kKeys) totals[key] = 0;
  for (const char* key : k::device::kKeys) device[key] = 0;
  for (const char* key : k::peer::kKeys) peer[key] = 0;
  totals[k::totals::kServedAllocations] = served;
  totals[k::totals::kPeakPhysicalBytes] = 100;
  totals[k::totals::kPeerEnableCalls] = 2;
  totals[k::totals::kPeerEnableSeconds] = 0.5;
  device[k::device::kDevice] = 1;
  device[k::device::kSetAccessCalls] = 3;
  device[k::device::kCompression] = "off";
  device.erase(k::device::kStreamOrdered);
  peer[k::peer::kGrants] = 1;
  peer[k::peer::kDenials] = denials;
  peer[k::peer::kPeakMappedBytes] = 4096;
  device[k::device::kPeers] = nlohmann::json::array({peer});
  nlohmann::json doc = {{k::kPid, 1},
                        {k::kPolicy, "none"},
                        {k::kTotals, totals},
                        {k::kDevices, nlohmann::json::array({device})},
                        {k::kDriverCalls, nlohmann::json::array()}};
  return doc.dump();
}

TEST(CompareStatistics, AddsUpTheProcessesOfARun) {
  const std::string dir = TempDir();
  auto write = [&](const std::string& name, int served, int denials) {
    std::ofstream(dir + "/" + name) << StatsText(served, denials);
  };
  write("a.json", 10, 3);
  write("b.json", 5, 0);
  std::ofstream(dir + "/c.json") << "not json";
  std::string error;
  const ShimFigures f =
      ReadShimFigures({dir + "/a.json", dir + "/b.json", dir + "/c.json"}, &error);
  EXPECT_EQ(f.files, 2);
  EXPECT_EQ(f.served_allocations, 15u);
  EXPECT_EQ(f.peak_physical_bytes, 200u);
  EXPECT_EQ(f.mapped_into_peers_bytes, 8192u);
  EXPECT_EQ(f.grants, 2u);
  EXPECT_EQ(f.denials, 3u);
  EXPECT_EQ(f.set_access_calls, 6u);
  EXPECT_EQ(f.peer_enable_calls, 4u);
  EXPECT_DOUBLE_EQ(f.peer_enable_seconds, 1.0);
  ASSERT_EQ(f.denials_by_pair.size(), 1u);
  EXPECT_EQ(f.denials_by_pair[0].device, 1);
  EXPECT_EQ(f.denials_by_pair[0].peer, 0);
  EXPECT_EQ(f.denials_by_pair[0].denials, 3u);
  EXPECT_NE(error.find("c.json is not a vmmshim statistics file"), std::string::npos) << error;
}

TEST(CompareFiles, TheDefaultDirectoryIsANewOneUnderTmpdir) {
  const std::string parent = TempDir();
  std::string error;
  const std::optional<std::string> a = MakeOutputDirectory(parent.c_str(), &error);
  const std::optional<std::string> b = MakeOutputDirectory(parent.c_str(), &error);
  ASSERT_TRUE(a && b) << error;
  EXPECT_EQ(a->rfind(parent + "/vmmshim-compare-", 0), 0u) << *a;
  EXPECT_NE(*a, *b);  // never an earlier comparison's
  EXPECT_EQ(access(a->c_str(), W_OK), 0);
  // No $TMPDIR (or an empty one): /tmp, not the current directory.
  const std::optional<std::string> tmp = MakeOutputDirectory("", &error);
  ASSERT_TRUE(tmp) << error;
  EXPECT_EQ(tmp->rfind("/tmp/vmmshim-compare-", 0), 0u) << *tmp;
  rmdir(tmp->c_str());
  EXPECT_FALSE(MakeOutputDirectory("/nonexistent/dir", &error));
  EXPECT_NE(error.find("cannot create a directory in /nonexistent/dir"), std::string::npos)
      << error;
}

TEST(CompareFigures, MedianAndUnits) {
  EXPECT_FALSE(Median({}));
  EXPECT_EQ(*Median({3, 1, 2}), 2);
  EXPECT_EQ(*Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(cli::FormatSeconds(0.0123), "12.3 ms");
  EXPECT_EQ(cli::FormatSeconds(1.5), "1.50 s");
  EXPECT_EQ(cli::FormatSeconds(120e-6), "120.0 us");
  EXPECT_EQ(cli::FormatBytes(512), "512 B");
  EXPECT_EQ(cli::FormatBytes(uint64_t{4} << 20), "4.00 MiB");
  EXPECT_EQ(cli::FormatBytes(uint64_t{3} << 29), "1.50 GiB");
}

std::vector<TableRow> PeerExchangeRows(const std::string& long_label) {
  auto row = [](std::string label, std::string result, double wall, double mapped,
                double denials) {
    TableRow r;
    r.label = std::move(label);
    r.result = std::move(result);
    r.wall = wall;
    r.wall_ratio = wall / 0.0486;
    r.served = 804;
    r.peak_physical = 280.0 * (1 << 20);
    r.mapped = mapped;
    r.grants = 2412 - denials;
    r.denials = denials;
    r.set_access = 46;
    r.peer_enable_seconds = 139.2e-6;
    r.peer_enable_calls = 12;
    return r;
  };
  TableRow native;
  native.label = "native";
  native.native = true;
  native.result = "differs (3/3)";
  native.wall = 0.0486;
  native.wall_ratio = 1;
  return {native, row("all", "ok", 0.064, 840.0 * (1 << 20), 0),
          row(long_label, "FAILED (3/3)", 123.456, 1e15, 12345678)};
}

size_t Widest(const std::string& table) {
  size_t widest = 0;
  for (const std::string& line : Split(table, '\n')) widest = std::max(widest, line.size());
  return widest;
}

TEST(CompareTable, TheDefaultTableFitsAHundredColumns) {
  for (bool memory : {false, true}) {
    std::vector<TableRow> rows = PeerExchangeRows("rules:/home/user/experiments/peer-rules.toml");
    if (memory) {
      for (TableRow& r : rows) {
        r.peak_device = 81.5e9;
        r.peak_device_ratio = 12.25;
      }
    }
    const std::string table = FormatTable(rows, /*wide=*/false);
    EXPECT_LE(Widest(table), kNarrowWidth) << table;
    EXPECT_EQ(table.find("cuMemSetAccess"), std::string::npos) << table;
    EXPECT_NE(table.find("peer-mapped"), std::string::npos) << table;
    EXPECT_NE(table.find("840.00 MiB"), std::string::npos) << table;
    EXPECT_NE(table.find("12345678"), std::string::npos) << table;
    EXPECT_NE(table.find("rules:/home/"), std::string::npos) << table;  // the label, cut
    // The memory pair only where it was measured.
    EXPECT_EQ(table.find("peak mem") != std::string::npos, memory) << table;
    EXPECT_EQ(table.find("12.25x") != std::string::npos, memory) << table;
  }
  // A short label is not cut.
  const std::string table = FormatTable(PeerExchangeRows("min-size:1M"), false);
  EXPECT_NE(table.find("\nmin-size:1M  FAILED (3/3)"), std::string::npos) << table;
}

TEST(CompareTable, WideHasEveryColumn) {
  const std::string table = FormatTable(PeerExchangeRows("min-size:1M"), /*wide=*/true);
  for (const char* column : {"wall (median)", "peak device memory", "served",
                             "shim peak physical", "mapped into peers", "grants", "denials",
                             "cuMemSetAccess", "cuCtxEnablePeerAccess", "139.2 us (12)"}) {
    EXPECT_NE(table.find(column), std::string::npos) << column << "\n" << table;
  }
  EXPECT_GT(Widest(table), kNarrowWidth);
}

class ChildTest : public ::testing::Test {
 protected:
  ChildSpec Spec(std::vector<std::string> argv) {
    ChildSpec s;
    s.argv = std::move(argv);
    s.env = {"PATH=/usr/bin:/bin"};
    s.stdout_file = dir_ + "/out";
    s.stderr_file = dir_ + "/err";
    return s;
  }
  std::string dir_ = TempDir();
};

TEST_F(ChildTest, ExitCodeOutputAndStandardError) {
  const ChildResult r =
      RunChild(Spec({"/bin/sh", "-c", "echo one; echo two; echo oops >&2; echo last >&2; exit 3"}));
  ASSERT_TRUE(r.started) << r.error;
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.signal, 0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.out, "one\ntwo\n");
  EXPECT_EQ(LastLine(dir_ + "/err"), "last");
  std::ifstream copy(dir_ + "/out");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(copy), {}), "one\ntwo\n");
  EXPECT_GT(r.wall_seconds, 0);
}

TEST_F(ChildTest, TheEnvironmentIsExactlyTheOneGiven) {
  ChildSpec s = Spec({"/bin/sh", "-c", "echo \"$FOO:${HOME:-unset}\""});
  s.env.push_back("FOO=bar");
  const ChildResult r = RunChild(s);
  EXPECT_EQ(r.out, "bar:unset\n");
}

TEST_F(ChildTest, ASignalIsReported) {
  const ChildResult r = RunChild(Spec({"/bin/sh", "-c", "kill -SEGV $$"}));
  ASSERT_TRUE(r.started);
  EXPECT_EQ(r.signal, SIGSEGV);
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
}

TEST_F(ChildTest, ATimedOutProgramAndItsChildrenAreKilled) {
  ChildSpec s = Spec({"/bin/sh", "-c", "sleep 30 & echo $!; wait"});
  s.timeout_seconds = 0.3;
  const ChildResult r = RunChild(s);
  ASSERT_TRUE(r.started);
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(r.wall_seconds, 10);
  const int grandchild = std::stoi(r.out);
  // Gone, or a zombie nobody reaped (a container's init may not reap).
  bool running = true;
  for (int i = 0; i < 50 && running; ++i) {
    usleep(20000);
    std::ifstream stat("/proc/" + std::to_string(grandchild) + "/stat");
    std::string line;
    running = std::getline(stat, line) && line.find(") Z") == std::string::npos;
  }
  EXPECT_FALSE(running) << "the program's own child survived";
}

TEST_F(ChildTest, AProgramThatCannotStartIsNamed) {
  const ChildResult r = RunChild(Spec({"/nonexistent/program"}));
  EXPECT_FALSE(r.started);
  EXPECT_EQ(r.error, "cannot run /nonexistent/program: No such file or directory");
}

TEST_F(ChildTest, TheSamplerSeesTheRunningProgram) {
  int samples = 0;
  bool own = false;
  RunChild(Spec({"/bin/sleep", "0.2"}), [&](pid_t pid) {
    ++samples;
    own |= DescendsFrom(pid, pid);
  });
  EXPECT_GT(samples, 3);
  EXPECT_TRUE(own);
  EXPECT_TRUE(DescendsFrom(getpid(), getppid()));
  EXPECT_FALSE(DescendsFrom(getppid(), getpid()));
}

TEST_F(ChildTest, AnInheritedIgnoredSigchldDoesNotLoseTheChild) {
  struct sigaction ign {}, old {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGCHLD, &ign, &old);
  const ChildResult r = RunChild(Spec({"/bin/sh", "-c", "exit 4"}));
  sigaction(SIGCHLD, &old, nullptr);
  EXPECT_EQ(r.exit_code, 4);
}

TEST_F(ChildTest, AHugeTimeLimitIsNoLimit) {
  ChildSpec s = Spec({"/bin/sh", "-c", "sleep 0.2; echo ok"});
  s.timeout_seconds = 1e300;
  const ChildResult r = RunChild(s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.out, "ok\n");
}

TEST_F(ChildTest, AnInterruptKillsTheProgramAndStaysNoted) {
  ClearInterrupted();
  ChildSpec s = Spec({"/bin/sh", "-c", "kill -HUP $PPID; sleep 30"});
  const ChildResult r = RunChild(s);
  EXPECT_TRUE(r.interrupted);
  EXPECT_LT(r.wall_seconds, 10);
  EXPECT_TRUE(Interrupted());
  ClearInterrupted();
  EXPECT_FALSE(Interrupted());
}

TEST_F(ChildTest, LastLineSkipsTrailingBlankLines) {
  std::ofstream(dir_ + "/t") << "first\nsecond\n\n  \n";
  EXPECT_EQ(LastLine(dir_ + "/t"), "second");
  std::ofstream(dir_ + "/e") << "";
  EXPECT_EQ(LastLine(dir_ + "/e"), "");
  EXPECT_EQ(LastLine(dir_ + "/missing"), "");
}

}  // namespace
}  // namespace vmmshim::compare

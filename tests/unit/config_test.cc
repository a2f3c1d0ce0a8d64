#include "config/config.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "config/rules_file.h"
#include "gtest/gtest.h"

namespace vmmshim {
namespace {

ParseResult Parse(const std::map<std::string, std::string>& env) {
  std::vector<std::string> names;
  for (const auto& [k, v] : env) names.push_back(k);
  return ParseConfig(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      names, 4242);
}

// `vmmshim run --stats FILE` names the process that writes FILE; its
// children (pid 4242 here) write FILE with their pid before the extension.
TEST(ConfigTest, StatsFileOfAChildCarriesItsPid) {
  EXPECT_EQ(Parse({{"VMMSHIM_STATS_FILE", "/tmp/run/stats.json"}, {"VMMSHIM_STATS_PID", "4242"}})
                .config.stats_file,
            "/tmp/run/stats.json");  // the program itself
  EXPECT_EQ(Parse({{"VMMSHIM_STATS_FILE", "/tmp/run/stats.json"}, {"VMMSHIM_STATS_PID", "7"}})
                .config.stats_file,
            "/tmp/run/stats.4242.json");
  EXPECT_EQ(Parse({{"VMMSHIM_STATS_FILE", "/tmp/r.d/stats"}, {"VMMSHIM_STATS_PID", "7"}})
                .config.stats_file,
            "/tmp/r.d/stats.4242");
  EXPECT_EQ(Parse({{"VMMSHIM_STATS_FILE", "/tmp/s.%p.json"}, {"VMMSHIM_STATS_PID", "7"}})
                .config.stats_file,
            "/tmp/s.4242.json");  // %p: as given
  EXPECT_EQ(Parse({{"VMMSHIM_STATS_FILE", "/tmp/s.json"}}).config.stats_file, "/tmp/s.json");
  // What `vmmshim report` globs for a missing FILE.
  EXPECT_EQ(ChildStatsPath("/tmp/run.d/run.json", "*"), "/tmp/run.d/run.*.json");
  EXPECT_EQ(ChildStatsPath("/tmp/run.d/stats", "*"), "/tmp/run.d/stats.*");
  EXPECT_EQ(ChildStatsPath("/tmp/.hidden", "7"), "/tmp/.hidden.7");
  ParseResult bad = Parse({{"VMMSHIM_STATS_FILE", "/tmp/s.json"}, {"VMMSHIM_STATS_PID", "x"}});
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_NE(bad.problems[0].find("VMMSHIM_STATS_PID='x'"), std::string::npos);
}

TEST(ConfigTest, DefaultsWhenUnset) {
  ParseResult r = Parse({});
  EXPECT_TRUE(r.problems.empty());
  EXPECT_TRUE(r.config.enable);
  EXPECT_EQ(r.config.log_level, LogLevel::kWarn);
  EXPECT_EQ(r.config.log_file, "");
}

TEST(ConfigTest, AcceptedValues) {
  ParseResult r = Parse({{"VMMSHIM_ENABLE", "0"},
                         {"VMMSHIM_LOG_LEVEL", "INFO"},
                         {"VMMSHIM_LOG_FILE", "/tmp/shim.%p.log"}});
  EXPECT_TRUE(r.problems.empty());
  EXPECT_FALSE(r.config.enable);
  EXPECT_EQ(r.config.log_level, LogLevel::kInfo);
  EXPECT_EQ(r.config.log_file, "/tmp/shim.4242.log");
  for (const char* v : {"no", "n", "false", "FALSE"}) {
    EXPECT_FALSE(Parse({{"VMMSHIM_ENABLE", v}}).config.enable) << v;
  }
  for (const char* v : {"yes", "Y", "true", "1"}) {
    EXPECT_TRUE(Parse({{"VMMSHIM_ENABLE", v}}).config.enable) << v;
  }
}

TEST(ConfigTest, MalformedValueGetsOneLineNamingVariableValueAndAccepted) {
  ParseResult r = Parse({{"VMMSHIM_ENABLE", "maybe"}, {"VMMSHIM_LOG_LEVEL", "loud"}});
  ASSERT_EQ(r.problems.size(), 2u);
  EXPECT_TRUE(r.config.enable);  // default kept
  EXPECT_EQ(r.config.log_level, LogLevel::kWarn);
  const std::string& enable = r.problems[0];
  EXPECT_NE(enable.find("VMMSHIM_ENABLE"), std::string::npos);
  EXPECT_NE(enable.find("'maybe'"), std::string::npos);
  EXPECT_NE(enable.find("yes/no"), std::string::npos);
  EXPECT_EQ(Parse({{"VMMSHIM_LOG_LEVEL", "Warning"}}).config.log_level, LogLevel::kWarn);
  EXPECT_EQ(enable.find('\n'), std::string::npos);
  EXPECT_NE(r.problems[1].find("trace, debug, info, warn (or warning), error, off"),
            std::string::npos);
  EXPECT_EQ(Parse({{"VMMSHIM_LOG_FILE", ""}}).problems.size(), 1u);
}

TEST(ConfigTest, WhereTheHostMemoryForPausesIsMade) {
  EXPECT_TRUE(Parse({}).config.paused_memory_addressable);
  EXPECT_FALSE(Parse({{"VMMSHIM_PAUSED_ACCESS", "FAULT"}}).config.paused_memory_addressable);
  // Where NCCL was told not to make host VMM memory, neither does the shim,
  // unless told to.
  ParseResult nccl = Parse({{"NCCL_CUMEM_HOST_ENABLE", "0"}});
  EXPECT_FALSE(nccl.config.paused_memory_addressable);
  ASSERT_EQ(nccl.notes.size(), 1u);
  EXPECT_NE(nccl.notes[0].find("NCCL_CUMEM_HOST_ENABLE=0"), std::string::npos);
  EXPECT_TRUE(Parse({{"NCCL_CUMEM_HOST_ENABLE", "0"}, {"VMMSHIM_PAUSED_ACCESS", "host"}})
                  .config.paused_memory_addressable);
  EXPECT_TRUE(Parse({{"NCCL_CUMEM_HOST_ENABLE", "1"}}).config.paused_memory_addressable);
  // A value that is not valid falls back to the default, which is fault here.
  EXPECT_FALSE(Parse({{"NCCL_CUMEM_HOST_ENABLE", "0"}, {"VMMSHIM_PAUSED_ACCESS", "hots"}})
                   .config.paused_memory_addressable);
  EXPECT_TRUE(Parse({}).config.host_memory_in_background);
  EXPECT_TRUE(Parse({{"VMMSHIM_HOST_POOL_MAKE", " Background"}}).config.host_memory_in_background);
  EXPECT_FALSE(Parse({{"VMMSHIM_HOST_POOL_MAKE", "pause"}}).config.host_memory_in_background);
  ParseResult r = Parse({{"VMMSHIM_HOST_POOL_MAKE", "later"}});
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("VMMSHIM_HOST_POOL_MAKE"), std::string::npos);
  EXPECT_NE(r.problems[0].find("background, pause"), std::string::npos);
  EXPECT_TRUE(r.config.host_memory_in_background);  // the default stands
  EXPECT_EQ(Parse({}).config.host_pool_max_bytes, 0u);
  EXPECT_EQ(Parse({{"VMMSHIM_HOST_POOL_MAX", "20G"}}).config.host_pool_max_bytes, size_t{20} << 30);
  r = Parse({{"VMMSHIM_HOST_POOL_MAX", "-1"}});
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("VMMSHIM_HOST_POOL_MAX='-1' is not valid"), std::string::npos);
  EXPECT_EQ(r.config.host_pool_max_bytes, 0u);
}

TEST(ConfigTest, UnknownVariableIsReported) {
  ParseResult r = Parse({{"VMMSHIM_ENABEL", "0"}});
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_TRUE(r.fatal_problems.empty());
  EXPECT_NE(r.problems[0].find("VMMSHIM_ENABEL"), std::string::npos);
  EXPECT_NE(r.problems[0].find("VMMSHIM_ENABLE"), std::string::npos);
  // A misspelt peer setting would silently run another policy: fatal.
  r = Parse({{"VMMSHIM_PEER_POLCY", "none"}});
  ASSERT_EQ(r.fatal_problems.size(), 1u);
  EXPECT_NE(r.fatal_problems[0].find("VMMSHIM_PEER_POLCY"), std::string::npos);
}

TEST(ConfigTest, DisabledShimIgnoresPeerSettings) {
  ParseResult r = Parse({{"VMMSHIM_ENABLE", "0"}, {"VMMSHIM_PEER_POLICY", "bogus"}});
  EXPECT_TRUE(r.fatal_problems.empty());
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("ignored: VMMSHIM_ENABLE=0"), std::string::npos);
  r = Parse({{"VMMSHIM_ENABLE", "0"}, {"VMMSHIM_PEER_POLCY", "none"}});  // a typo, too
  EXPECT_TRUE(r.fatal_problems.empty());
  EXPECT_EQ(r.problems.size(), 1u);
}

TEST(ConfigTest, EveryOptionIsDocumented) {
  std::ifstream in(std::string(VMMSHIM_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in.good());
  std::stringstream doc;
  doc << in.rdbuf();
  // Each option has one table row holding every field of the options table.
  std::string line;
  int rows = 0;
  while (std::getline(doc, line)) {
    for (const OptionInfo& option : Options()) {
      if (line.rfind(std::string("| `") + option.name + "` |", 0) != 0) continue;
      ++rows;
      for (const char* field : {option.type, option.default_value, option.accepted,
                                option.description}) {
        EXPECT_NE(line.find(field), std::string::npos)
            << option.name << ": docs/configuration.md lacks \"" << field << "\"";
      }
    }
  }
  EXPECT_EQ(rows, static_cast<int>(Options().size()));
}

TEST(ConfigTest, ParseBytesAcceptsUnits) {
  EXPECT_EQ(ParseBytes("4096"), 4096u);
  EXPECT_EQ(ParseBytes("1K"), 1024u);
  EXPECT_EQ(ParseBytes("1 MiB"), size_t{1} << 20);
  EXPECT_EQ(ParseBytes("2g"), size_t{2} << 30);
  EXPECT_EQ(ParseBytes("3GB"), size_t{3} << 30);
  EXPECT_EQ(ParseBytes("512B"), 512u);
  EXPECT_EQ(ParseBytes("1T"), size_t{1} << 40);
  for (const char* bad : {"", "M", "1.5M", "1X", "-1", "1 MiBs", "99999999999999999999",
                          "99999999999T", "1Ki", "1BB"}) {
    EXPECT_FALSE(ParseBytes(bad)) << bad;
  }
}

TEST(ConfigTest, CacheLimitInBytesOrPercent) {
  EXPECT_EQ(Parse({}).config.cache_limit_percent, 10);
  ParseResult r = Parse({{"VMMSHIM_CACHE_LIMIT", "25%"}});
  EXPECT_EQ(r.config.cache_limit_percent, 25);
  r = Parse({{"VMMSHIM_CACHE_LIMIT", "4G"}});
  EXPECT_LT(r.config.cache_limit_percent, 0);
  EXPECT_EQ(r.config.cache_limit_bytes, size_t{4} << 30);
  r = Parse({{"VMMSHIM_CACHE_LIMIT", "0"}});
  EXPECT_EQ(r.config.cache_limit_bytes, 0u);
  for (const char* bad : {"150%", "-1%", "lots", "%", "nan%", "NaN%", "inf%"}) {
    r = Parse({{"VMMSHIM_CACHE_LIMIT", bad}});
    EXPECT_EQ(r.problems.size(), 1u) << bad;
    EXPECT_EQ(r.config.cache_limit_percent, 10) << bad;
  }
}

TEST(ConfigTest, PeerPolicyFromVariables) {
  EXPECT_EQ(Parse({}).config.peer_policy.kind, PeerPolicy::Kind::kAll);
  EXPECT_EQ(Parse({{"VMMSHIM_PEER_POLICY", "none"}}).config.peer_policy.kind,
            PeerPolicy::Kind::kNone);
  ParseResult r = Parse({{"VMMSHIM_PEER_POLICY", "min-size"}, {"VMMSHIM_PEER_MIN_BYTES", "2M"}});
  EXPECT_TRUE(r.fatal_problems.empty());
  EXPECT_EQ(r.config.peer_policy.kind, PeerPolicy::Kind::kMinSize);
  EXPECT_EQ(r.config.peer_policy.min_bytes, size_t{2} << 20);
}

TEST(ConfigTest, MalformedPeerSettingsAreFatalWithOneLine) {
  ParseResult r = Parse({{"VMMSHIM_PEER_POLICY", "some"}});
  ASSERT_EQ(r.fatal_problems.size(), 1u);
  EXPECT_NE(r.fatal_problems[0].find("VMMSHIM_PEER_POLICY='some'"), std::string::npos);
  EXPECT_NE(r.fatal_problems[0].find("all, none, min-size, rules"), std::string::npos);
  r = Parse({{"VMMSHIM_PEER_POLICY", "min-size"}, {"VMMSHIM_PEER_MIN_BYTES", "lots"}});
  ASSERT_EQ(r.fatal_problems.size(), 1u);
  EXPECT_NE(r.fatal_problems[0].find("VMMSHIM_PEER_MIN_BYTES='lots'"), std::string::npos);
  r = Parse({{"VMMSHIM_PEER_POLICY", "min-size"}});
  ASSERT_EQ(r.fatal_problems.size(), 1u);
  EXPECT_NE(r.fatal_problems[0].find("needs VMMSHIM_PEER_MIN_BYTES"), std::string::npos);
  r = Parse({{"VMMSHIM_PEER_POLICY", "rules"}});
  ASSERT_EQ(r.fatal_problems.size(), 1u);
  EXPECT_NE(r.fatal_problems[0].find("needs VMMSHIM_CONFIG"), std::string::npos);
  r = Parse({{"VMMSHIM_CONFIG", "/nonexistent/rules.toml"}});
  ASSERT_EQ(r.fatal_problems.size(), 1u);
  EXPECT_NE(r.fatal_problems[0].find("/nonexistent/rules.toml"), std::string::npos);
}

class RulesFileTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!path_.empty()) std::remove(path_.c_str());
  }
  std::string Write(const std::string& text) {
    path_ = ::testing::TempDir() + "/rules_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".toml";
    std::ofstream(path_) << text;
    return path_;
  }
  std::string path_;
};

TEST_F(RulesFileTest, ParsesRulesInOrder) {
  absl::StatusOr<PeerPolicy> p = LoadRulesFile(Write(R"(# comment
default = "allow"

[[rule]]
owner = 0
peer = [1, 2]
max_size = "64K"
action = "deny"

[[rule]]
tag = "kv"
min_size = 1048576
action = "allow"
)"));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->rules.size(), 2u);
  EXPECT_EQ(p->rules[0].line, 4);
  EXPECT_EQ(p->rules[1].line, 10);
  EXPECT_TRUE(p->default_allow);
  EXPECT_FALSE(p->Allows(0, 1, 4096, ""));    // rule 1
  EXPECT_TRUE(p->Allows(0, 3, 4096, ""));     // peer 3 not in rule 1: default
  EXPECT_TRUE(p->Allows(1, 0, 4096, ""));     // owner 1: default
  EXPECT_TRUE(p->Allows(0, 1, 1 << 20, "kv"));
  EXPECT_TRUE(p->Allows(0, 0, 1, ""));        // the owner always
  EXPECT_EQ(p->Allowed(0, 4, 4096, "").bits(), 0b1001u);
  EXPECT_NE(p->DenialReason(0, 1, 4096, "").find(":4"), std::string::npos);
}

TEST_F(RulesFileTest, UnreadableFilesAreReportedNotThrown) {
  absl::StatusOr<PeerPolicy> p = LoadRulesFile(::testing::TempDir());  // a directory
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("not a regular file"), absl::string_view::npos);
  p = LoadRulesFile("/nonexistent/rules.toml");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("cannot open the rules file: No such file"),
            absl::string_view::npos)
      << p.status();
}

TEST_F(RulesFileTest, ProblemsNameFileLineAndProblem) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"default = \"deny\"\n[[rule]]\npeer = 1\nactoin = \"allow\"\n", ":4: unknown key 'actoin'"},
      {"[[rule]]\npeer = 1\n", ":1: this [[rule]] has no action"},
      {"[[rule]]\npeer = []\naction = \"allow\"\n", ":2: peer list is empty"},
      {"[[rule]]\naction = \"allow\"\n[other]\nx = 1\n", ":3: unknown key 'other'"},
      {"[rule]\naction = \"allow\"\n", ":1: rule must be written as [[rule]] tables"},
      {"[[rule]]\naction = \"allow\"\n\n[[rule]]\nmin_size = \"lots\"\naction = \"deny\"\n",
       ":5: min_size must be a byte count"},
      {"[[rule]]\nowner = 99\naction = \"allow\"\n", ":2: owner must be"},
      {"[[rule]]\nmin_size = \"2M\"\nmax_size = \"1M\"\naction = \"allow\"\n",
       ":3: max_size is below min_size"},
      {"default = \"maybe\"\n", ":1: default must be"},
      {"polcy = \"all\"\n", ":1: unknown key 'polcy'"},
      {"[[rule]\naction = \"allow\"\n", ":1: "},  // syntax error from cpptoml
      {"[[rule]]\naction = \"allow\"\naction = \"deny\"\n", ":3: "},  // duplicate key
  };
  for (const Case& c : cases) {
    absl::StatusOr<PeerPolicy> p = LoadRulesFile(Write(c.text));
    ASSERT_FALSE(p.ok()) << c.text;
    EXPECT_NE(p.status().message().find(path_), absl::string_view::npos) << p.status();
    EXPECT_NE(p.status().message().find(c.want), absl::string_view::npos)
        << p.status() << " lacks " << c.want;
  }
}

}  // namespace
}  // namespace vmmshim

#include "config/config.h"

#include <fstream>
#include <map>
#include <sstream>
#include <string>

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

TEST(ConfigTest, UnknownVariableIsReported) {
  ParseResult r = Parse({{"VMMSHIM_ENABEL", "0"}});
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("VMMSHIM_ENABEL"), std::string::npos);
  EXPECT_NE(r.problems[0].find("VMMSHIM_ENABLE"), std::string::npos);
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

}  // namespace
}  // namespace vmmshim

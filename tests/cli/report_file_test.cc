// cli/report_file.h: `vmmshim report` tells a statistics file from
// compare's result file and from anything else, and says what a file lacks
// in its own words, never the JSON library's.
#include "cli/report_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/report/stats_schema.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace vmmshim::cli {
namespace {

namespace k = stats_schema;

// A statistics file with every key of the schema, zero but for a few.
nlohmann::json Stats() {
  nlohmann::json totals, device, peer;
  for (const char* key : k::totals::kKeys) totals[key] = 0;
  for (const char* key : k::device::kKeys) device[key] = 0;
  for (const char* key : k::peer::kKeys) peer[key] = 0;
  totals[k::totals::kServedAllocations] = 7;
  device[k::device::kCompression] = "off";
  device.erase(k::device::kStreamOrdered);
  device[k::device::kPeers] = nlohmann::json::array({peer});
  return {{k::kPid, 42},
          {k::kPolicy, "min-size"},
          {k::kTotals, totals},
          {k::kDevices, nlohmann::json::array({device})},
          {k::kDriverCalls, nlohmann::json::array()}};
}

// compare.json as WriteResultFiles writes it, in part.
nlohmann::json CompareResult() {
  auto mode = [](const char* policy, bool native, const char* result, double wall,
                 nlohmann::json mapped, nlohmann::json denials, const char* failure) {
    return nlohmann::json{{"policy", policy},   {"native", native},
                          {"runs", 3},          {"failed_runs", failure[0] ? 3 : 0},
                          {"result", result},   {"failure", failure},
                          {"wall_median_seconds", wall},
                          {"peak_device_bytes", nullptr},
                          {"mapped_into_peers_bytes", mapped},
                          {"denials", denials}, {"grants", 2412},
                          {"set_access_calls", 46}, {"peer_enable_seconds", 1e-4},
                          {"peer_enable_calls", 12}};
  };
  return {{"command", {"build/examples/peer_exchange"}},
          {"repeat", 3},
          {"warmup", 1},
          {"check", nullptr},
          {"out_dir", "/tmp/vmmshim-compare-x"},
          {"varying_lines", {{{"line", 1}, {"native", {"time: 1 ms", "time: 2 ms"}}}}},
          {"modes",
           {mode("native", true, "ok", 0.05, nullptr, nullptr, ""),
            mode("all", false, "ok", 0.06, 840.0 * (1 << 20), 0, ""),
            mode("none", false, "FAILED (3/3)", 0.055, 0, 2412,
                 "exit 1 (native: exit 0)")}},
          {"runs", nlohmann::json::array()}};
}

class ReportFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  // The error of a file that is refused; it must never quote the library.
  std::string Refused(const std::string& path) {
    std::string error;
    EXPECT_FALSE(ReportFile(path, false, &error)) << path;
    EXPECT_EQ(error.find("json.exception"), std::string::npos) << error;
    EXPECT_EQ(error.find("not found"), std::string::npos) << error;
    return error;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_ = [] {
    char tmpl[] = "/tmp/vmmshim-report-file-test-XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
};

TEST_F(ReportFileTest, AStatisticsFileIsPrintedAsTables) {
  std::string error;
  const std::optional<std::string> text =
      ReportFile(Write("s.json", Stats().dump()), false, &error);
  ASSERT_TRUE(text) << error;
  EXPECT_NE(text->find("vmmshim statistics of pid 42"), std::string::npos) << *text;
  EXPECT_NE(text->find("policy: min-size"), std::string::npos) << *text;
}

TEST_F(ReportFileTest, CompareResultIsPrintedAsCompareTable) {
  const std::string path = Write("compare.json", CompareResult().dump());
  std::string error;
  const std::optional<std::string> text = ReportFile(path, false, &error);
  ASSERT_TRUE(text) << error;
  EXPECT_NE(text->find(path + " is vmmshim compare's result file, not a statistics file"),
            std::string::npos)
      << *text;
  EXPECT_NE(text->find("vmmshim compare: build/examples/peer_exchange"), std::string::npos);
  EXPECT_NE(text->find("peer-mapped"), std::string::npos) << *text;
  EXPECT_NE(text->find("\nnone    FAILED (3/3)"), std::string::npos) << *text;
  EXPECT_NE(text->find("840.00 MiB"), std::string::npos) << *text;
  EXPECT_NE(text->find("1.20x"), std::string::npos) << *text;  // all's wall against native's
  EXPECT_NE(text->find("- none: exit 1 (native: exit 0)"), std::string::npos) << *text;
  EXPECT_NE(text->find("left out of the comparison"), std::string::npos) << *text;
  EXPECT_EQ(text->find("cuMemSetAccess"), std::string::npos) << *text;
  const std::optional<std::string> wide = ReportFile(path, true, &error);
  ASSERT_TRUE(wide) << error;
  EXPECT_NE(wide->find("cuMemSetAccess"), std::string::npos) << *wide;
  // One that lacks what the table needs is still named for what it is.
  nlohmann::json partial = CompareResult();
  partial["modes"][1].erase("policy");
  EXPECT_NE(Refused(Write("partial.json", partial.dump()))
                .find("is vmmshim compare's result file, not a statistics file, and it lacks "
                      "'policy'"),
            std::string::npos);
}

TEST_F(ReportFileTest, AnythingElseSaysWhatWasExpectedAndWhatIsMissing) {
  const std::string expected =
      "is not a vmmshim statistics file (one written by VMMSHIM_STATS_FILE or `vmmshim run "
      "--stats`): ";
  std::string error = Refused(Write("other.json", R"({"name": "something else"})"));
  EXPECT_NE(error.find("other.json " + expected + "it has no 'pid'"), std::string::npos)
      << error;
  nlohmann::json no_totals = Stats();
  no_totals.erase(k::kTotals);
  error = Refused(Write("no_totals.json", no_totals.dump()));
  EXPECT_NE(error.find(expected + "it has no 'totals'"), std::string::npos) << error;
  nlohmann::json wrong = Stats();
  wrong[k::kTotals][k::totals::kServedAllocations] = "seven";
  error = Refused(Write("wrong.json", wrong.dump()));
  EXPECT_NE(error.find("'totals.served_allocations' is a string, not a number"),
            std::string::npos)
      << error;
  nlohmann::json peer = Stats();
  peer[k::kDevices][0][k::device::kPeers][0].erase(k::peer::kGrants);
  error = Refused(Write("peer.json", peer.dump()));
  EXPECT_NE(error.find("it has no 'devices[0].peers[0].grants'"), std::string::npos) << error;
  error = Refused(Write("list.json", "[1, 2]"));
  EXPECT_NE(error.find(expected + "it is an array, not a JSON object"), std::string::npos)
      << error;
  error = Refused(Write("text.txt", "time: 12 ms\n"));
  EXPECT_NE(error.find(expected + "it is not JSON"), std::string::npos) << error;
  error = Refused(dir_ + "/missing.json");
  EXPECT_NE(error.find("cannot open '" + dir_ + "/missing.json': No such file"), std::string::npos)
      << error;
}

}  // namespace
}  // namespace vmmshim::cli

// What a comparison leaves in its directory: summary.csv, runs.csv,
// compare.json and the chart (internal.h: WriteResultFiles, DrawChart).
#include <cstdio>
#include <sstream>

#include "cli/compare/internal.h"
#include "nlohmann/json.hpp"

namespace vmmshim::compare {
namespace {

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

nlohmann::json OptJson(std::optional<double> v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::string OptCsv(std::optional<double> v) {
  if (!v) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", *v);
  return buf;
}

}  // namespace

bool WriteResultFiles(const Results& results, std::string* error) {
  const CompareOptions& options = *results.options;
  const std::vector<Summary>& summaries = results.summaries;
  const std::vector<Run>& runs = *results.runs;
  const DeviceMemorySampler* sampler = results.sampler;
  const std::string& out_dir = results.out_dir;
  const Summary& native = summaries.front();
  // Files.
  std::ostringstream summary_csv;
  summary_csv << "policy,runs,failed_runs,wall_median_s,wall_vs_native,peak_device_bytes,"
                 "peak_device_vs_native,served_allocations,shim_peak_physical_bytes,"
                 "mapped_into_peers_bytes,grants,denials,set_access_calls,peer_enable_seconds,"
                 "peer_enable_calls,failure\n";
  for (const Summary& s : summaries) {
    auto ratio = [&](std::optional<double> v, std::optional<double> n) {
      return v && n && *n > 0 ? OptCsv(*v / *n) : std::string();
    };
    summary_csv << CsvField(s.mode->label) << "," << s.runs << "," << s.failed << ","
                << OptCsv(s.wall) << "," << ratio(s.wall, native.wall) << ","
                << OptCsv(s.peak_device) << "," << ratio(s.peak_device, native.peak_device)
                << "," << OptCsv(s.served) << "," << OptCsv(s.peak_physical) << ","
                << OptCsv(s.mapped) << "," << OptCsv(s.grants) << "," << OptCsv(s.denials)
                << "," << OptCsv(s.set_access) << "," << OptCsv(s.peer_enable_seconds) << ","
                << OptCsv(s.peer_enable_calls) << "," << CsvField(s.failure) << "\n";
  }
  nlohmann::json doc;
  doc["command"] = options.command;
  doc["policies"] = nlohmann::json::array();
  for (const PolicySpec& p : options.policies) doc["policies"].push_back(p.label);
  doc["repeat"] = options.repeat;
  doc["warmup"] = options.warmup;
  doc["check"] = options.check_regex ? nlohmann::json(*options.check_regex) : nlohmann::json();
  doc["timeout_seconds"] = options.timeout_seconds;
  doc["library"] = options.library;
  doc["out_dir"] = out_dir;
  doc["peak_device_memory_source"] =
      sampler->Available() ? "nvml " + sampler->Source() : "unavailable: " + sampler->Unavailable();
  // The lines left out of the comparison (VaryingLines), numbered from 1
  // among the compared lines.
  const VaryingLines& varying = *results.varying;
  doc["native_runs_learnt_from"] = varying.runs();
  doc["varying_lines"] = nlohmann::json::array();
  for (size_t p : varying.Positions()) {
    doc["varying_lines"].push_back({{"line", p + 1}, {"native", varying.Texts(p)}});
  }
  doc["varying_lines_caveat"] = varying.caveat();
  doc["modes"] = nlohmann::json::array();
  for (const Summary& s : summaries) {
    nlohmann::json pairs = nlohmann::json::array();
    for (const auto& p : s.denials_by_pair) {
      pairs.push_back({{"device", p.device}, {"peer", p.peer}, {"denials", p.denials}});
    }
    doc["modes"].push_back({{"policy", s.mode->label},
                            {"native", !s.mode->policy},
                            {"result", ResultOf(s, runs)},
                            {"runs", s.runs},
                            {"failed_runs", s.failed},
                            {"runs_without_statistics", s.without_stats},
                            {"failure", s.failure},
                            {"wall_median_seconds", OptJson(s.wall)},
                            {"peak_device_bytes", OptJson(s.peak_device)},
                            {"served_allocations", OptJson(s.served)},
                            {"shim_peak_physical_bytes", OptJson(s.peak_physical)},
                            {"mapped_into_peers_bytes", OptJson(s.mapped)},
                            {"grants", OptJson(s.grants)},
                            {"denials", OptJson(s.denials)},
                            {"set_access_calls", OptJson(s.set_access)},
                            {"peer_enable_seconds", OptJson(s.peer_enable_seconds)},
                            {"peer_enable_calls", OptJson(s.peer_enable_calls)},
                            {"denials_by_pair", pairs},
                            {"denial_log", s.denial_lines}});
  }
  std::ostringstream runs_csv;
  runs_csv << "policy,round,warmup,exit_code,signal,timed_out,wall_seconds,peak_device_bytes,"
              "served_allocations,mapped_into_peers_bytes,grants,denials,set_access_calls,"
              "peer_enable_seconds,failure\n";
  doc["runs"] = nlohmann::json::array();
  for (const Run& r : runs) {
    const bool shim = r.mode->policy && r.shim.files > 0;
    auto fig = [&](uint64_t v) { return shim ? std::to_string(v) : std::string(); };
    runs_csv << CsvField(r.mode->label) << "," << r.round << "," << (r.warmup ? 1 : 0) << ","
             << r.child.exit_code << "," << r.child.signal << "," << (r.child.timed_out ? 1 : 0)
             << "," << OptCsv(r.child.wall_seconds) << ","
             << (r.peak_device_bytes ? std::to_string(*r.peak_device_bytes) : "") << ","
             << fig(r.shim.served_allocations) << "," << fig(r.shim.mapped_into_peers_bytes)
             << "," << fig(r.shim.grants) << "," << fig(r.shim.denials) << ","
             << fig(r.shim.set_access_calls) << ","
             << (shim ? OptCsv(r.shim.peer_enable_seconds) : "") << "," << CsvField(r.failure)
             << "\n";
    doc["runs"].push_back(
        {{"policy", r.mode->label},
         {"round", r.round},
         {"warmup", r.warmup},
         {"exit_code", r.child.exit_code},
         {"signal", r.child.signal},
         {"timed_out", r.child.timed_out},
         {"wall_seconds", r.child.wall_seconds},
         {"peak_device_bytes",
          r.peak_device_bytes ? nlohmann::json(*r.peak_device_bytes) : nlohmann::json()},
         {"statistics_files", r.shim.files},
         {"failure", r.failure},
         {"stdout", r.stdout_file},
         {"stderr", r.stderr_file}});
  }
  const std::string json_path = out_dir + "/compare.json";
  // Program output quoted in failures need not be UTF-8: replaced, not refused.
  const std::string json_text =
      doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (!WriteFile(out_dir + "/summary.csv", summary_csv.str(), error) ||
      !WriteFile(out_dir + "/runs.csv", runs_csv.str(), error) ||
      !WriteFile(json_path, json_text, error)) {
    return false;
  }
  std::printf("\nfiles in %s: summary.csv, runs.csv, compare.json (vmmshim report prints "
              "it), runs/ (each run's output, statistics and shim log)\n",
              out_dir.c_str());
  for (const Run& r : runs) {
    if (!r.stats_error.empty()) {
      std::printf("warning: %s\n", r.stats_error.c_str());
      break;
    }
  }

  return true;
}

void DrawChart(const Results& results, const std::vector<std::string>& environment) {
  const CompareOptions& options = *results.options;
  const std::string& out_dir = results.out_dir;
  const std::string& runs_dir = results.runs_dir;
  const std::string json_path = out_dir + "/compare.json";
  // The chart, where python3 can import matplotlib.
  if (options.chart_script.empty()) {
    std::printf("chart: not drawn (compare_chart.py not found next to vmmshim)\n");
  } else {
    ChildSpec chart;
    chart.argv = {"python3", options.chart_script, json_path, out_dir + "/compare.png"};
    chart.env = environment;
    chart.stdout_file = runs_dir + "/chart.out";
    chart.stderr_file = runs_dir + "/chart.err";
    chart.timeout_seconds = 120;
    const ChildResult c = RunChild(chart);
    if (c.started && c.exit_code == 0) {
      std::printf("chart: %s/compare.png\n", out_dir.c_str());
    } else {
      const std::string why = c.started ? LastLine(chart.stderr_file) : c.error;
      std::printf("chart: not drawn (%s)\n", why.empty() ? Describe(c).c_str() : why.c_str());
    }
  }
}

}  // namespace vmmshim::compare

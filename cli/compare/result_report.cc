// compare.json read back into compare's table, for `vmmshim report`
// (compare.h: FormatResultFile). It reads what WriteResultFiles writes.
#include <algorithm>
#include <stdexcept>

#include "cli/compare/internal.h"
#include "nlohmann/json.hpp"

namespace vmmshim::compare {
namespace {

// A key compare.json should have but this one lacks, by name.
class Lacks : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

const nlohmann::json& At(const nlohmann::json& object, const char* key) {
  if (!object.is_object() || !object.contains(key)) throw Lacks(key);
  return object.at(key);
}

std::optional<double> Figure(const nlohmann::json& mode, const char* key) {
  const auto it = mode.find(key);
  if (it == mode.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::string Text(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

int Count(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_number_integer() ? it->get<int>() : 0;
}

std::optional<double> RatioOf(std::optional<double> value, std::optional<double> native) {
  if (!value || !native || *native <= 0) return std::nullopt;
  return *value / *native;
}

std::string Format(const nlohmann::json& doc, const std::string& path, bool wide) {
  const nlohmann::json& modes = At(doc, "modes");
  if (!modes.is_array() || modes.empty()) throw Lacks("modes");
  std::string out = path + " is vmmshim compare's result file, not a statistics file; "
                           "its table:\n\n";
  std::string command;
  if (const auto it = doc.find("command"); it != doc.end() && it->is_array()) {
    for (const auto& a : *it) {
      if (a.is_string()) command += (command.empty() ? "" : " ") + a.get<std::string>();
    }
  }
  out += "vmmshim compare: " + command + "\n";
  const std::string check = Text(doc, "check");
  out += std::to_string(Count(doc, "repeat")) + " counted run(s) of each mode (" +
         std::to_string(Count(doc, "warmup")) + " warm-up run(s) not counted); checked: " +
         "exit status and " +
         (check.empty() ? std::string("the standard output, but for lines that vary between "
                                      "native runs")
                        : "the lines matching '" + check + "'") +
         "\n\n";
  std::optional<double> native_wall, native_peak;
  for (const auto& m : modes) {
    if (m.is_object() && m.value("native", false)) {
      native_wall = Figure(m, "wall_median_seconds");
      native_peak = Figure(m, "peak_device_bytes");
    }
  }
  std::vector<TableRow> rows;
  std::string notes;
  for (const auto& m : modes) {
    TableRow r;
    const nlohmann::json& label = At(m, "policy");
    if (!label.is_string()) throw Lacks("modes[].policy");
    r.label = label.get<std::string>();
    r.native = m.value("native", false);
    const int runs = Count(m, "runs"), failed = Count(m, "failed_runs");
    r.result = Text(m, "result");
    if (r.result.empty()) {  // written before compare.json had the result
      r.result = failed == 0 ? "ok"
                             : std::string(r.native ? "differs" : "FAILED") + " (" +
                                   std::to_string(failed) + "/" + std::to_string(runs) + ")";
    }
    r.wall = Figure(m, "wall_median_seconds");
    r.wall_ratio = RatioOf(r.wall, native_wall);
    r.peak_device = Figure(m, "peak_device_bytes");
    r.peak_device_ratio = RatioOf(r.peak_device, native_peak);
    r.served = Figure(m, "served_allocations");
    r.peak_physical = Figure(m, "shim_peak_physical_bytes");
    r.mapped = Figure(m, "mapped_into_peers_bytes");
    r.grants = Figure(m, "grants");
    r.denials = Figure(m, "denials");
    r.set_access = Figure(m, "set_access_calls");
    r.peer_enable_seconds = Figure(m, "peer_enable_seconds");
    r.peer_enable_calls = Figure(m, "peer_enable_calls");
    if (const std::string failure = Text(m, "failure"); !failure.empty()) {
      notes += "- " + r.label + ": " + failure + "\n";
    }
    rows.push_back(r);
  }
  out += FormatTable(rows, wide) + "\n";
  if (const auto it = doc.find("varying_lines");
      it != doc.end() && it->is_array() && !it->empty()) {
    std::string lines;
    for (const auto& v : *it) {
      if (v.is_object() && v.contains("line") && v["line"].is_number_integer()) {
        lines += (lines.empty() ? "" : ", ") + std::to_string(v["line"].get<int>());
      }
    }
    notes += "- left out of the comparison (they differ between native runs): line(s) " +
             Truncate(lines, 200) + "\n";
  }
  out += notes;
  if (const std::string dir = Text(doc, "out_dir"); !dir.empty()) {
    out += "- each run's output, statistics files (vmmshim report prints them) and shim log: " +
           dir + "/runs\n";
  }
  return out;
}

}  // namespace

bool IsResultFile(const nlohmann::json& doc) {
  return doc.is_object() && doc.contains("modes") && doc.contains("runs");
}

std::optional<std::string> FormatResultFile(const nlohmann::json& doc, const std::string& path,
                                            bool wide, std::string* error) {
  try {
    return Format(doc, path, wide);
  } catch (const Lacks& e) {
    *error = path + " is vmmshim compare's result file, not a statistics file, and it lacks '" +
             e.what() + "': written by another version of vmmshim? (summary.csv next to it "
             "has the table's figures)";
  } catch (const nlohmann::json::exception& e) {
    *error = path + " is vmmshim compare's result file, not a statistics file, and one of its "
                    "values is not of the kind compare writes (summary.csv next to it has the "
                    "table's figures)";
  }
  return std::nullopt;
}

}  // namespace vmmshim::compare

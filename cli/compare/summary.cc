// The summaries of a comparison and the table printed from them
// (internal.h: Summarize, PrintSummary).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cli/compare/internal.h"
#include "cli/format.h"

namespace vmmshim::compare {
namespace {

using cli::FormatBytes;
using cli::FormatSeconds;

std::string RatioCell(std::optional<double> ratio) {
  if (!ratio) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", *ratio);
  return buf;
}

std::optional<double> Ratio(std::optional<double> value, std::optional<double> native) {
  if (!value || !native || *native <= 0) return std::nullopt;
  return *value / *native;
}

std::vector<std::string> DenialLogLines(const std::vector<std::string>& logs, size_t most) {
  std::vector<std::string> lines;
  for (const std::string& path : logs) {
    std::ifstream in(path);
    std::string line;
    while (lines.size() < most && std::getline(in, line)) {
      if (line.find("denied access") != std::string::npos) lines.push_back(line);
    }
  }
  return lines;
}

// "3 allocations of device 1 denied to peer 0", or for many pairs the
// first four and "... and 8 more pairs (2412 in all)".
std::string DenialSummary(const std::vector<ShimFigures::PairDenials>& pairs) {
  if (pairs.empty()) return "no denials counted";
  std::string text;
  uint64_t total = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    total += pairs[i].denials;
    if (i >= 4) continue;
    text += (i == 0 ? "" : ", ") + std::to_string(pairs[i].denials) + " allocation(s) of device " +
            std::to_string(pairs[i].device) + " denied to peer " + std::to_string(pairs[i].peer);
  }
  if (pairs.size() > 4) {
    text += ", and " + std::to_string(pairs.size() - 4) + " more pairs (" +
            std::to_string(total) + " denials in all)";
  }
  return text;
}

// Which lines were left out of the comparison and why: the first few with
// their native texts (compare.json has them all).
void PrintVaryingLines(const VaryingLines& varying, bool filtered,
                       const std::vector<Run>& runs) {
  constexpr size_t kShown = 5;
  const char* what = filtered ? "checked line" : "line";
  const std::vector<size_t> positions = varying.Positions();
  if (!positions.empty()) {
    std::printf("- left out of the comparison (every mode): %zu %s%s that differ%s between "
                "the %d native runs:\n",
                positions.size(), what, positions.size() == 1 ? "" : "s",
                positions.size() == 1 ? "s" : "", varying.runs());
    for (size_t i = 0; i < std::min(positions.size(), kShown); ++i) {
      std::string texts;
      for (const std::string& t : varying.Texts(positions[i])) {
        texts += (texts.empty() ? "'" : ", '") + Truncate(t, 40) + "'";
      }
      std::printf("    %s %zu: %s%s\n", what, positions[i] + 1, texts.c_str(),
                  varying.Texts(positions[i]).size() == VaryingLines::kTextsKept ? ", ..." : "");
    }
    if (positions.size() > kShown) {
      std::printf("    and %zu more (compare.json: varying_lines)\n", positions.size() - kShown);
    }
  }
  if (!varying.caveat().empty()) std::printf("- %s.\n", varying.caveat().c_str());
  if (varying.runs() < 2 && varying.caveat().empty()) {
    for (const Run& r : runs) {
      if (StartsWith(r.failure, "standard output differs")) {
        std::printf("- one native run only: every line compared; with two or more (--warmup, "
                    "--repeat) lines that differ between native runs are left out.\n");
        break;
      }
    }
  }
}

std::string Cell(std::optional<double> v, bool integer) {
  if (!v) return "-";
  char buf[32];
  if (integer) {
    std::snprintf(buf, sizeof buf, "%.0f", *v);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", *v);
  }
  return buf;
}

std::string BytesCell(std::optional<double> v) {
  return v ? FormatBytes(static_cast<uint64_t>(std::llround(*v))) : "-";
}

std::string SecondsCell(std::optional<double> v) { return v ? FormatSeconds(*v) : "-"; }

// Columns padded to their widest cell; the first two (policy, result)
// left-aligned, figures right.
std::string Columns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const size_t pad = width[i] - row[i].size();
      if (i < 2) {
        line += row[i] + std::string(pad, ' ');
      } else {
        line += std::string(pad, ' ') + row[i];
      }
      if (i + 1 < row.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string EnableCell(const TableRow& r) {
  if (r.peer_enable_calls && *r.peer_enable_calls == 0) return "no calls";
  if (r.peer_enable_seconds && r.peer_enable_calls) {
    return FormatSeconds(*r.peer_enable_seconds) + " (" + Cell(r.peer_enable_calls, true) + ")";
  }
  return "-";
}

}  // namespace

std::string FormatTable(const std::vector<TableRow>& rows, bool wide) {
  std::vector<std::vector<std::string>> cells;
  if (wide) {
    cells.push_back({"policy", "result", "wall (median)", "vs native", "peak device memory",
                     "vs native", "served", "shim peak physical", "mapped into peers", "grants",
                     "denials", "cuMemSetAccess", "cuCtxEnablePeerAccess"});
    for (const TableRow& r : rows) {
      cells.push_back({r.label, r.result, SecondsCell(r.wall), RatioCell(r.wall_ratio),
                       BytesCell(r.peak_device), RatioCell(r.peak_device_ratio),
                       Cell(r.served, true), BytesCell(r.peak_physical), BytesCell(r.mapped),
                       Cell(r.grants, true), Cell(r.denials, true), Cell(r.set_access, true),
                       EnableCell(r)});
    }
    return Columns(cells);
  }
  // Peak device memory is '-' in every row without NVML: no column then.
  const bool memory = std::any_of(rows.begin(), rows.end(),
                                  [](const TableRow& r) { return r.peak_device.has_value(); });
  auto row_of = [&](std::string label, std::string result, std::vector<std::string> figures) {
    std::vector<std::string> row = {std::move(label), std::move(result)};
    for (size_t i = 0; i < figures.size(); ++i) {
      if (memory || (i != 2 && i != 3)) row.push_back(std::move(figures[i]));
    }
    return row;
  };
  cells.push_back(row_of("policy", "result",
                         {"wall", "vs native", "peak mem", "vs native", "peer-mapped",
                          "denials"}));
  for (const TableRow& r : rows) {
    cells.push_back(row_of(r.label, r.result,
                           {SecondsCell(r.wall), RatioCell(r.wall_ratio),
                            BytesCell(r.peak_device), RatioCell(r.peak_device_ratio),
                            BytesCell(r.mapped), Cell(r.denials, true)}));
  }
  // What the other columns leave to the policy label; a longer one is cut.
  size_t others = 0;
  for (size_t i = 1; i < cells[0].size(); ++i) {
    size_t w = 0;
    for (const auto& row : cells) w = std::max(w, row[i].size());
    others += w + 2;
  }
  const size_t label_width = std::max<size_t>(12, kNarrowWidth - std::min(kNarrowWidth, others));
  for (auto& row : cells) row[0] = Truncate(row[0], label_width);
  return Columns(cells);
}

std::vector<Summary> Summarize(const std::vector<Mode>& modes, const std::vector<Run>& runs) {
  std::vector<Summary> summaries;
  for (const Mode& m : modes) {
    Summary s;
    s.mode = &m;
    std::vector<double> wall, peak, failed_wall, failed_peak, served, physical, mapped, grants,
        denials, setaccess, enable_s, enable_n;
    for (const Run& r : runs) {
      if (r.mode != &m || r.warmup) continue;
      ++s.runs;
      if (!r.failure.empty() && s.failed++ == 0) {
        s.failure = r.failure;
        s.denials_by_pair = r.shim.denials_by_pair;
        s.denial_lines = DenialLogLines(r.log_files, 3);
      }
      // Time and memory of runs that matched native; a crashed or killed
      // run's time says nothing about the program's (all runs where none did).
      (r.failure.empty() ? wall : failed_wall).push_back(r.child.wall_seconds);
      if (r.peak_device_bytes) {
        (r.failure.empty() ? peak : failed_peak)
            .push_back(static_cast<double>(*r.peak_device_bytes));
      }
      if (!m.policy) continue;
      if (r.shim.files == 0) {
        ++s.without_stats;
        continue;
      }
      served.push_back(static_cast<double>(r.shim.served_allocations));
      physical.push_back(static_cast<double>(r.shim.peak_physical_bytes));
      mapped.push_back(static_cast<double>(r.shim.mapped_into_peers_bytes));
      grants.push_back(static_cast<double>(r.shim.grants));
      denials.push_back(static_cast<double>(r.shim.denials));
      setaccess.push_back(static_cast<double>(r.shim.set_access_calls));
      enable_s.push_back(r.shim.peer_enable_seconds);
      enable_n.push_back(static_cast<double>(r.shim.peer_enable_calls));
    }
    s.wall = Median(wall.empty() ? failed_wall : wall);
    s.peak_device = Median(wall.empty() ? failed_peak : peak);
    s.served = Median(served);
    s.peak_physical = Median(physical);
    s.mapped = Median(mapped);
    s.grants = Median(grants);
    s.denials = Median(denials);
    s.set_access = Median(setaccess);
    s.peer_enable_seconds = Median(enable_s);
    s.peer_enable_calls = Median(enable_n);
    summaries.push_back(s);
  }
  return summaries;
}

bool NoShim(const Summary& s, const std::vector<Run>& runs) {
  if (!s.mode->policy || s.without_stats < s.runs) return false;
  for (const Run& r : runs) {
    if (r.mode == s.mode && !r.warmup && !r.child.timed_out && r.child.signal == 0) return true;
  }
  return false;
}

std::string ResultOf(const Summary& s, const std::vector<Run>& runs) {
  if (NoShim(s, runs)) return "NO SHIM";
  if (s.failed == 0) return "ok";
  return (s.mode->policy ? "FAILED (" : "differs (") + std::to_string(s.failed) + "/" +
         std::to_string(s.runs) + ")";
}

int PrintSummary(const Results& results) {
  const CompareOptions& options = *results.options;
  const std::vector<Summary>& summaries = results.summaries;
  const std::vector<Run>& runs = *results.runs;
  const Run* reference = results.reference;
  const DeviceMemorySampler* sampler = results.sampler;
  const Summary& native = summaries.front();
  // The table.
  std::string command;
  for (const std::string& a : options.command) command += (command.empty() ? "" : " ") + a;
  std::printf("vmmshim compare: %s\n", command.c_str());
  std::printf("%d counted run(s) of each mode, alternating (%d warm-up run(s) of each not "
              "counted); results checked against the first counted native run: exit status "
              "and %s\n\n",
              options.repeat, options.warmup,
              options.check_regex ? ("the lines matching '" + *options.check_regex + "'").c_str()
                                  : "the standard output, but for lines that vary between "
                                    "native runs");
  std::vector<TableRow> rows;
  bool any_failed = false, any_without_shim = false;
  for (const Summary& s : summaries) {
    TableRow row;
    row.label = s.mode->label;
    row.native = !s.mode->policy;
    row.result = ResultOf(s, runs);
    if (NoShim(s, runs)) {
      any_without_shim = true;
    } else if (s.failed > 0 && s.mode->policy) {
      any_failed = true;
    }
    row.wall = s.wall;
    row.wall_ratio = Ratio(s.wall, native.wall);
    row.peak_device = s.peak_device;
    row.peak_device_ratio = Ratio(s.peak_device, native.peak_device);
    row.served = s.served;
    row.peak_physical = s.peak_physical;
    row.mapped = s.mapped;
    row.grants = s.grants;
    row.denials = s.denials;
    row.set_access = s.set_access;
    row.peer_enable_seconds = s.peer_enable_seconds;
    row.peer_enable_calls = s.peer_enable_calls;
    rows.push_back(row);
  }
  std::fputs(FormatTable(rows, options.wide).c_str(), stdout);
  std::printf("\n");
  // Notes kept under 100 columns, as the table.
  if (!options.wide) {
    std::printf("- %s: medians of the counted runs, and the ratio to native's.\n",
                sampler->Available() ? "wall, peak mem" : "wall");
    std::printf("- peer-mapped: bytes mapped into peers; --wide: every column.\n");
  }
  std::printf("- native: no shim, so '-'. Natively a peer that enables access maps every\n"
              "  allocation: what policy all reproduces.\n");
  if (sampler->Available()) {
    std::printf("- peak device memory: NVML, %s, sampled every 10 ms.\n",
                sampler->Source() == "process"
                    ? "the program's processes (context included, as nvidia-smi shows)"
                    : "the devices' used memory above its level before each run (NVML shows no "
                      "process of the program: another pid namespace)");
  } else {
    std::printf("- peak device memory: not measured (%s)%s.\n", sampler->Unavailable().c_str(),
                options.wide ? "; 'shim peak physical' is the shim's own count of the physical "
                               "memory it held"
                             : "");
  }
  if (options.wide) {
    std::printf("- cuCtxEnablePeerAccess: seconds the program spent in it per run (and its "
                "calls), the driver's enable and the shim's grants together.\n");
  }
  const ChildResult& ref = reference->child;
  if (ref.signal != 0 || ref.exit_code != 0) {
    std::printf("- native itself ends with %s%s: the policies are compared with that.\n",
                Describe(ref).c_str(),
                reference->stderr_last.empty()
                    ? ""
                    : ("; last line of stderr: " + Truncate(reference->stderr_last, 200)).c_str());
  }
  PrintVaryingLines(*results.varying, results.filtered, runs);
  if (results.checked_none) {
    std::printf("- --check matched no line of native's output: only exit statuses were "
                "compared.\n");
  }
  for (const Summary& s : summaries) {
    if (NoShim(s, runs)) {
      std::printf("- %s: no run wrote a statistics file: the shim did not start in the program "
                  "(ld.so could not preload it: see %s/%s.*.err; or the program never used "
                  "CUDA). Nothing of the shim's was measured.\n",
                  s.mode->label.c_str(), results.runs_dir.c_str(), s.mode->slug.c_str());
    } else if (s.without_stats > 0) {
      std::printf("- %s: %d run(s) wrote no statistics file (the program ended by _exit or a "
                  "signal?); its shim figures are the other runs'.\n",
                  s.mode->label.c_str(), s.without_stats);
    }
    if (s.failed == 0) continue;
    if (!s.mode->policy) {
      const bool output = s.failure.rfind("standard output differs", 0) == 0;
      std::printf("- native runs do not all agree with the first counted one: %s%s\n",
                  s.failure.c_str(),
                  output ? "; use --check REGEX to compare only the lines that must agree" : "");
      continue;
    }
    std::printf("- %s: %s; %s\n", s.mode->label.c_str(), s.failure.c_str(),
                DenialSummary(s.denials_by_pair).c_str());
    for (const std::string& l : s.denial_lines) std::printf("    %s\n", l.c_str());
  }
  std::fflush(stdout);
  if (any_without_shim) return 2;
  return any_failed ? 1 : 0;
}

}  // namespace vmmshim::compare

#include "cli/compare/compare.h"

#include <dirent.h>
#include <sys/stat.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <regex.h>
#include <set>
#include <sstream>

#include "config/rules_file.h"
#include "nlohmann/json.hpp"
#include "cli/compare/child_process.h"
#include "cli/compare/device_memory.h"

extern char** environ;

namespace vmmshim::compare {
namespace {

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

// The variables a policy run sets itself.
bool SetByPolicyRun(const std::string& name) {
  static const std::set<std::string> kNames = {
      "VMMSHIM_ENABLE",   "VMMSHIM_PEER_POLICY", "VMMSHIM_PEER_MIN_BYTES", "VMMSHIM_CONFIG",
      "VMMSHIM_STATS_FILE", "VMMSHIM_LOG_FILE", "VMMSHIM_LOG_LEVEL"};
  return kNames.count(name) != 0;
}

std::string NameOf(const std::string& entry) { return entry.substr(0, entry.find('=')); }

// LD_PRELOAD without libvmmshim*.so entries (separated by spaces or colons).
std::string PreloadWithoutShim(const std::string& value) {
  std::string kept;
  std::string item;
  for (char c : value + " ") {
    if (c != ' ' && c != ':') {
      item += c;
      continue;
    }
    if (item.empty()) continue;
    const std::string base = item.substr(item.rfind('/') + 1);
    if (!StartsWith(base, "libvmmshim")) kept += (kept.empty() ? "" : " ") + item;
    item.clear();
  }
  return kept;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = Split(text, '\n');
  for (std::string& l : lines) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
  }
  return lines;
}

std::string Truncate(std::string s, size_t n) {
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

// At most 100 characters of `line` around position `at` (where two lines
// first differ), with "..." where it was cut, so the difference shows.
std::string Around(const std::string& line, size_t at) {
  if (line.size() <= 100) return line;
  const size_t from = at > 40 ? std::min(at - 40, line.size() - 94) : 0;
  const size_t n = std::min<size_t>(94, line.size() - from);
  return (from > 0 ? "..." : "") + line.substr(from, n) + (from + n < line.size() ? "..." : "");
}

std::string Slug(const std::string& label) {
  std::string s;
  for (char c : label) s += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  return Truncate(s, 40);
}

std::string Ratio(std::optional<double> value, std::optional<double> native) {
  if (!value || !native || *native <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", *value / *native);
  return buf;
}

// Files in `dir` whose names start with `prefix`, sorted.
std::vector<std::string> FilesWithPrefix(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> found;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (StartsWith(e->d_name, prefix)) found.push_back(dir + "/" + e->d_name);
    }
    closedir(d);
  }
  std::sort(found.begin(), found.end());
  return found;
}

bool MakeDirs(const std::string& path, std::string* error) {
  std::string partial;
  for (const std::string& part : Split(path, '/')) {
    partial += part;
    if (!partial.empty() && mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      *error = "cannot create " + partial + ": " + std::strerror(errno);
      return false;
    }
    partial += '/';
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = path + " is not a directory";
    return false;
  }
  return true;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `text` to `path`; false and `*error` naming the path on failure.
bool WriteFile(const std::string& path, const std::string& text, std::string* error) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    *error = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

struct Mode {
  std::string label;  // "native" or the policy's label
  std::optional<PolicySpec> policy;
  std::string slug;
};

struct Run {
  const Mode* mode = nullptr;
  int round = 0;  // counted rounds from 0; warm-ups negative
  bool warmup = false;
  ChildResult child;
  std::optional<uint64_t> peak_device_bytes;
  ShimFigures shim;
  std::string stats_error;
  std::string stderr_file, stdout_file;
  std::string stderr_last;
  std::vector<std::string> log_files;
  std::string failure;  // empty: matched native
};

struct Summary {
  const Mode* mode = nullptr;
  int runs = 0, failed = 0, without_stats = 0;
  std::optional<double> wall, peak_device;
  std::optional<double> served, peak_physical, mapped, grants, denials, set_access,
      peer_enable_seconds, peer_enable_calls;
  std::string failure;  // the first failed run's description
  std::vector<ShimFigures::PairDenials> denials_by_pair;
  std::vector<std::string> denial_lines;
};

std::string Describe(const ChildResult& c) {
  if (c.timed_out) return "timed out (killed)";
  if (c.interrupted) return "interrupted";
  if (c.signal != 0) return "killed by " + SignalName(c.signal);
  return "exit " + std::to_string(c.exit_code);
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

void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      // The first two columns (policy, result) left-aligned, figures right.
      const size_t pad = width[i] - row[i].size();
      if (i < 2) {
        line += row[i] + std::string(pad, ' ');
      } else {
        line += std::string(pad, ' ') + row[i];
      }
      if (i + 1 < row.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

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

std::optional<std::vector<PolicySpec>> ParsePolicies(const std::string& list,
                                                     std::string* error) {
  std::vector<PolicySpec> specs;
  std::set<std::string> seen;
  for (const std::string& item : Split(list, ',')) {
    PolicySpec spec;
    spec.label = item;
    const size_t colon = item.find(':');
    spec.policy = item.substr(0, colon);
    const std::string arg = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (spec.policy == "all" || spec.policy == "none") {
      if (colon != std::string::npos) {
        *error = "policy '" + item + "': " + spec.policy + " takes no argument";
        return std::nullopt;
      }
    } else if (spec.policy == "min-size") {
      if (arg.empty() || !ParseBytes(arg)) {
        *error = "policy '" + item + "': min-size needs a byte count, as in min-size:1M";
        return std::nullopt;
      }
      spec.min_bytes = arg;
    } else if (spec.policy == "rules") {
      if (arg.empty()) {
        *error = "policy '" + item + "': rules needs a rules file, as in rules:rules.toml";
        return std::nullopt;
      }
      // The shim's own parser: its message names the file, line and problem.
      if (absl::StatusOr<PeerPolicy> loaded = LoadRulesFile(arg); !loaded.ok()) {
        *error = "policy '" + item + "': " + std::string(loaded.status().message());
        return std::nullopt;
      }
      char real[PATH_MAX];
      spec.rules_file = realpath(arg.c_str(), real) != nullptr ? real : arg;
    } else {
      *error = "policy '" + item + "' is not one of all, none, min-size:BYTES, rules:FILE";
      return std::nullopt;
    }
    if (!seen.insert(item).second) {
      *error = "policy '" + item + "' is listed twice";
      return std::nullopt;
    }
    specs.push_back(spec);
  }
  if (specs.empty()) {
    *error = "no policy given";
    return std::nullopt;
  }
  return specs;
}

std::vector<std::string> NativeEnvironment(const std::vector<std::string>& base) {
  std::vector<std::string> env;
  for (const std::string& e : base) {
    const std::string name = NameOf(e);
    if (StartsWith(name, "VMMSHIM_")) continue;
    if (name == "LD_PRELOAD") {
      const std::string kept = PreloadWithoutShim(e.substr(e.find('=') + 1));
      if (!kept.empty()) env.push_back("LD_PRELOAD=" + kept);
      continue;
    }
    env.push_back(e);
  }
  return env;
}

std::vector<std::string> PolicyEnvironment(const std::vector<std::string>& base,
                                           const std::string& library, const PolicySpec& policy,
                                           const std::string& stats_file,
                                           const std::string& log_file) {
  std::vector<std::string> env;
  std::string preload = library;
  for (const std::string& e : base) {
    const std::string name = NameOf(e);
    if (name == "LD_PRELOAD") {
      const std::string kept = PreloadWithoutShim(e.substr(e.find('=') + 1));
      if (!kept.empty()) preload += " " + kept;
      continue;
    }
    if (StartsWith(name, "VMMSHIM_") && SetByPolicyRun(name)) continue;
    env.push_back(e);
  }
  env.push_back("LD_PRELOAD=" + preload);
  env.push_back("VMMSHIM_PEER_POLICY=" + policy.policy);
  if (!policy.min_bytes.empty()) env.push_back("VMMSHIM_PEER_MIN_BYTES=" + policy.min_bytes);
  if (!policy.rules_file.empty()) env.push_back("VMMSHIM_CONFIG=" + policy.rules_file);
  env.push_back("VMMSHIM_STATS_FILE=" + stats_file);
  env.push_back("VMMSHIM_LOG_FILE=" + log_file);
  env.push_back("VMMSHIM_LOG_LEVEL=info");
  return env;
}

std::optional<LineFilter> LineFilter::Make(const std::optional<std::string>& regex,
                                           std::string* error) {
  LineFilter f;
  if (!regex) return f;
  auto* re = new regex_t;
  if (int rc = regcomp(re, regex->c_str(), REG_EXTENDED | REG_NOSUB); rc != 0) {
    char why[256];
    regerror(rc, re, why, sizeof why);
    delete re;
    *error = "'" + *regex + "' is not a regular expression (POSIX extended, as grep -E): " + why;
    return std::nullopt;
  }
  f.regex_ = std::shared_ptr<const void>(re, [](const void* p) {
    regfree(static_cast<regex_t*>(const_cast<void*>(p)));
    delete static_cast<const regex_t*>(p);
  });
  return f;
}

std::vector<std::string> LineFilter::Lines(const std::string& out) const {
  std::vector<std::string> lines = compare::Lines(out);
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (regex_ == nullptr) return lines;
  const auto* re = static_cast<const regex_t*>(regex_.get());
  std::vector<std::string> kept;
  for (const std::string& l : lines) {
    if (regexec(re, l.c_str(), 0, nullptr, 0) == 0) kept.push_back(l);
  }
  return kept;
}

std::string LinesDifference(const std::vector<std::string>& want,
                            const std::vector<std::string>& got, bool filtered) {
  const char* what = filtered ? "checked line" : "line";
  for (size_t i = 0; i < std::min(want.size(), got.size()); ++i) {
    if (want[i] != got[i]) {
      const size_t n = std::min(want[i].size(), got[i].size());
      const size_t at = static_cast<size_t>(
          std::mismatch(want[i].begin(), want[i].begin() + n, got[i].begin()).first -
          want[i].begin());
      return std::string(what) + " " + std::to_string(i + 1) + ": '" + Around(got[i], at) +
             "' instead of '" + Around(want[i], at) + "'";
    }
  }
  if (want.size() != got.size()) {
    return std::to_string(got.size()) + " " + what + "s instead of " +
           std::to_string(want.size());
  }
  return "";
}

ShimFigures ReadShimFigures(const std::vector<std::string>& files, std::string* error) {
  ShimFigures f;
  std::map<std::pair<int, int>, uint64_t> pairs;
  for (const std::string& path : files) {
    std::ifstream in(path);
    try {
      nlohmann::json doc;
      in >> doc;
      const nlohmann::json& t = doc.at("totals");
      f.served_allocations += t.at("served_allocations").get<uint64_t>();
      f.peak_physical_bytes += t.at("peak_physical_bytes").get<uint64_t>();
      f.peer_enable_calls += t.value("peer_enable_calls", uint64_t{0});
      f.peer_enable_seconds += t.value("peer_enable_seconds", 0.0);
      for (const nlohmann::json& d : doc.at("devices")) {
        f.set_access_calls += d.at("set_access_calls").get<uint64_t>();
        const int device = d.at("device").get<int>();
        for (const nlohmann::json& p : d.at("peers")) {
          f.grants += p.at("grants").get<uint64_t>();
          const uint64_t denials = p.at("denials").get<uint64_t>();
          f.denials += denials;
          f.mapped_into_peers_bytes += p.at("peak_mapped_bytes").get<uint64_t>();
          if (denials > 0) pairs[{device, p.at("peer").get<int>()}] += denials;
        }
      }
      ++f.files;
    } catch (const nlohmann::json::exception& e) {
      if (error->empty()) *error = path + " is not a vmmshim statistics file: " + e.what();
    }
  }
  for (const auto& [pair, denials] : pairs) {
    f.denials_by_pair.push_back({pair.first, pair.second, denials});
  }
  return f;
}

std::optional<double> Median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string FormatSeconds(double seconds) {
  char buf[32];
  if (seconds < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.1f us", seconds * 1e6);
  } else if (seconds < 1) {
    std::snprintf(buf, sizeof buf, "%.1f ms", seconds * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", seconds);
  }
  return buf;
}

std::string FormatBytes(uint64_t bytes) {
  char buf[32];
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(uint64_t{1} << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / double(uint64_t{1} << 20));
  } else if (bytes >= (uint64_t{1} << 10)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / double(uint64_t{1} << 10));
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

int RunCompare(const CompareOptions& options) {
  std::string error;
  if (options.repeat < 1 || options.warmup < 0 || options.command.empty()) {
    std::fprintf(stderr, "vmmshim compare: nothing to run (repeat %d, warmup %d)\n",
                 options.repeat, options.warmup);
    return 2;
  }
  if (options.out_dir.empty()) {
    std::fprintf(stderr, "vmmshim compare: --out: an empty directory name\n");
    return 2;
  }
  std::optional<LineFilter> filter = LineFilter::Make(options.check_regex, &error);
  if (!filter) {
    std::fprintf(stderr, "vmmshim compare: --check %s\n", error.c_str());
    return 2;
  }
  if (options.library.find_first_of(" :") != std::string::npos) {
    std::fprintf(stderr,
                 "vmmshim compare: the library path '%s' holds a space or colon, which "
                 "LD_PRELOAD cannot carry; copy libvmmshim.so elsewhere and give --lib\n",
                 options.library.c_str());
    return 2;
  }
  if (!MakeDirs(options.out_dir + "/runs", &error)) {
    std::fprintf(stderr, "vmmshim compare: %s\n", error.c_str());
    return 2;
  }
  // Absolute: the program may change directory before the shim writes.
  char real[PATH_MAX];
  const std::string out_dir =
      realpath(options.out_dir.c_str(), real) != nullptr ? real : options.out_dir;
  const std::string runs_dir = out_dir + "/runs";
  std::vector<Mode> modes;
  modes.push_back({"native", std::nullopt, "0-native"});
  for (size_t i = 0; i < options.policies.size(); ++i) {
    modes.push_back({options.policies[i].label, options.policies[i],
                     std::to_string(i + 1) + "-" + Slug(options.policies[i].label)});
  }
  // Files of an earlier comparison in the same directory would be read as
  // this one's.
  for (const Mode& m : modes) {
    for (const std::string& f : FilesWithPrefix(runs_dir, m.slug + ".")) unlink(f.c_str());
  }
  std::vector<std::string> base;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) base.emplace_back(*e);

  DeviceMemorySampler sampler;
  std::vector<Run> runs;
  double slowest_native = 0;
  const int total = static_cast<int>(modes.size()) * (options.warmup + options.repeat);
  runs.reserve(static_cast<size_t>(total));

  // One run; false when it could not be started or was interrupted.
  auto run_one = [&](const Mode& mode, int round, bool warmup) -> bool {
    Run run;
    run.mode = &mode;
    run.round = round;
    run.warmup = warmup;
    const std::string name =
        mode.slug + "." + (warmup ? "w" + std::to_string(-round) : std::to_string(round));
    const std::string stem = runs_dir + "/" + name;
    run.stdout_file = stem + ".out";
    run.stderr_file = stem + ".err";
    ChildSpec spec;
    spec.argv = options.command;
    spec.stdout_file = run.stdout_file;
    spec.stderr_file = run.stderr_file;
    spec.env = mode.policy ? PolicyEnvironment(base, options.library, *mode.policy,
                                               stem + ".stats.%p.json", stem + ".shim.%p.log")
                           : NativeEnvironment(base);
    spec.timeout_seconds = options.timeout_seconds;
    if (spec.timeout_seconds == 0 && slowest_native > 0) {
      spec.timeout_seconds = std::max(60.0, 10 * slowest_native);
    }
    std::fprintf(stderr, "vmmshim compare: run %zu of %d: %s%s\n", runs.size() + 1, total,
                 mode.label.c_str(), warmup ? " (warm-up, not counted)" : "");
    sampler.Begin();
    run.child = RunChild(spec, [&](pid_t pid) { sampler.Sample(pid); });
    if (!run.child.started) {
      std::fprintf(stderr, "vmmshim compare: %s\n", run.child.error.c_str());
      return false;
    }
    run.child.out.clear();  // compared from its file: memory does not grow with the runs
    run.peak_device_bytes = sampler.Peak();
    run.stderr_last = LastLine(run.stderr_file);
    if (mode.policy) {
      run.shim = ReadShimFigures(FilesWithPrefix(runs_dir, name + ".stats."), &run.stats_error);
      run.log_files = FilesWithPrefix(runs_dir, name + ".shim.");
    } else if (!run.child.timed_out) {
      slowest_native = std::max(slowest_native, run.child.wall_seconds);
    }
    runs.push_back(std::move(run));
    return !runs.back().child.interrupted && !Interrupted();
  };
  auto interrupted = [&] {
    std::fprintf(stderr, "vmmshim compare: interrupted; the program's process group was "
                         "killed; no table\n");
    return 130;
  };
  ClearInterrupted();
  for (int w = 0; w < options.warmup; ++w) {
    for (const Mode& m : modes) {
      if (!run_one(m, -(w + 1), true)) return Interrupted() ? interrupted() : 2;
    }
  }
  for (int r = 0; r < options.repeat; ++r) {
    // Rotated by r, every other round reversed: neither a mode's place nor
    // its neighbours stay the same.
    std::vector<const Mode*> order;
    for (size_t k = 0; k < modes.size(); ++k) order.push_back(&modes[(r + k) % modes.size()]);
    if (r % 2 == 1) std::reverse(order.begin(), order.end());
    for (const Mode* m : order) {
      if (!run_one(*m, r, false)) return Interrupted() ? interrupted() : 2;
    }
  }

  // The reference: the first counted native run (warm-ups absorb first-run
  // effects such as JIT compilation).
  const Run* reference = nullptr;
  for (const Run& r : runs) {
    if (!r.mode->policy && !r.warmup) {
      reference = &r;
      break;
    }
  }
  if (reference->child.timed_out) {
    std::fprintf(stderr,
                 "vmmshim compare: the first counted native run was killed at the time limit "
                 "(--timeout): nothing to compare with; raise --timeout\n");
    return 2;
  }
  const std::vector<std::string> want = filter->Lines(ReadFile(reference->stdout_file));
  for (Run& r : runs) {
    if (&r == reference) continue;
    const ChildResult& c = r.child;
    const ChildResult& ref = reference->child;
    if (c.timed_out || c.signal != ref.signal || c.exit_code != ref.exit_code) {
      r.failure = Describe(c) + " (native: " + Describe(ref) + ")";
    } else if (std::string diff =
                   LinesDifference(want, filter->Lines(ReadFile(r.stdout_file)), filter->filters());
               !diff.empty()) {
      r.failure = "standard output differs from native: " + diff;
    }
    if (!r.failure.empty() && !r.stderr_last.empty()) {
      r.failure += "; last line of stderr: " + Truncate(r.stderr_last, 200);
    }
  }

  // Per mode: medians of the counted runs.
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
  const Summary& native = summaries.front();
  // A policy none of whose counted runs wrote statistics though one ended
  // on its own (killed runs write none): the shim was not in the program.
  auto NoShim = [&](const Summary& s) {
    if (!s.mode->policy || s.without_stats < s.runs) return false;
    for (const Run& r : runs) {
      if (r.mode == s.mode && !r.warmup && !r.child.timed_out && r.child.signal == 0) return true;
    }
    return false;
  };

  // The table.
  std::string command;
  for (const std::string& a : options.command) command += (command.empty() ? "" : " ") + a;
  std::printf("vmmshim compare: %s\n", command.c_str());
  std::printf("%d counted run(s) of each mode, alternating (%d warm-up run(s) of each not "
              "counted); results checked against the first counted native run: exit status "
              "and %s\n\n",
              options.repeat, options.warmup,
              options.check_regex ? ("the lines matching '" + *options.check_regex + "'").c_str()
                                  : "the whole standard output");
  std::vector<std::vector<std::string>> rows = {
      {"policy", "result", "wall (median)", "vs native", "peak device memory", "vs native",
       "served", "shim peak physical", "mapped into peers", "grants", "denials",
       "cuMemSetAccess", "cuCtxEnablePeerAccess"}};
  bool any_failed = false, any_without_shim = false;
  for (const Summary& s : summaries) {
    std::string result = "ok";
    const std::string counts =
        " (" + std::to_string(s.failed) + "/" + std::to_string(s.runs) + ")";
    if (NoShim(s)) {
      result = "NO SHIM";
      any_without_shim = true;
    } else if (s.failed > 0) {
      result = (s.mode->policy ? "FAILED" : "differs") + counts;
      if (s.mode->policy) any_failed = true;
    }
    std::string enable = "-";
    if (s.peer_enable_calls && *s.peer_enable_calls == 0) {
      enable = "no calls";
    } else if (s.peer_enable_seconds && s.peer_enable_calls) {
      enable = FormatSeconds(*s.peer_enable_seconds) + " (" + Cell(s.peer_enable_calls, true) +
               ")";
    }
    rows.push_back({s.mode->label, result, SecondsCell(s.wall),
                    s.mode->policy ? Ratio(s.wall, native.wall) : "1.00x",
                    BytesCell(s.peak_device),
                    s.mode->policy ? Ratio(s.peak_device, native.peak_device)
                                   : (s.peak_device ? "1.00x" : "-"),
                    Cell(s.served, true), BytesCell(s.peak_physical), BytesCell(s.mapped),
                    Cell(s.grants, true), Cell(s.denials, true), Cell(s.set_access, true),
                    enable});
  }
  PrintTable(rows);
  std::printf("\n");
  std::printf("- native: no shim in the process, so its figures are '-'. Natively "
              "cudaDeviceEnablePeerAccess maps every allocation of the device into the peer: "
              "what policy all reproduces (its 'mapped into peers').\n");
  if (sampler.Available()) {
    std::printf("- peak device memory: NVML, %s, sampled every 10 ms.\n",
                sampler.Source() == "process"
                    ? "the program's processes (context included, as nvidia-smi shows)"
                    : "the devices' used memory above its level before each run (NVML shows no "
                      "process of the program: another pid namespace)");
  } else {
    std::printf("- peak device memory: not measured (%s); 'shim peak physical' is the shim's "
                "own count of the physical memory it held.\n",
                sampler.Unavailable().c_str());
  }
  std::printf("- cuCtxEnablePeerAccess: seconds the program spent in it per run (and its "
              "calls), the driver's enable and the shim's grants together.\n");
  const ChildResult& ref = reference->child;
  if (ref.signal != 0 || ref.exit_code != 0) {
    std::printf("- native itself ends with %s%s: the policies are compared with that.\n",
                Describe(ref).c_str(),
                reference->stderr_last.empty()
                    ? ""
                    : ("; last line of stderr: " + Truncate(reference->stderr_last, 200)).c_str());
  }
  if (filter->filters() && want.empty()) {
    std::printf("- --check matched no line of native's output: only exit statuses were "
                "compared.\n");
  }
  for (const Summary& s : summaries) {
    if (NoShim(s)) {
      std::printf("- %s: no run wrote a statistics file: the shim did not start in the program "
                  "(ld.so could not preload it: see %s/%s.*.err; or the program never used "
                  "CUDA). Nothing of the shim's was measured.\n",
                  s.mode->label.c_str(), runs_dir.c_str(), s.mode->slug.c_str());
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
      sampler.Available() ? "nvml " + sampler.Source() : "unavailable: " + sampler.Unavailable();
  doc["modes"] = nlohmann::json::array();
  for (const Summary& s : summaries) {
    nlohmann::json pairs = nlohmann::json::array();
    for (const auto& p : s.denials_by_pair) {
      pairs.push_back({{"device", p.device}, {"peer", p.peer}, {"denials", p.denials}});
    }
    doc["modes"].push_back({{"policy", s.mode->label},
                            {"native", !s.mode->policy},
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
  if (!WriteFile(out_dir + "/summary.csv", summary_csv.str(), &error) ||
      !WriteFile(out_dir + "/runs.csv", runs_csv.str(), &error) ||
      !WriteFile(json_path, json_text, &error)) {
    std::fprintf(stderr, "vmmshim compare: %s\n", error.c_str());
    return 2;
  }
  std::printf("\nwritten: %s/summary.csv, runs.csv, compare.json, runs/ (each run's output, "
              "statistics and shim log)\n",
              out_dir.c_str());
  for (const Run& r : runs) {
    if (!r.stats_error.empty()) {
      std::printf("warning: %s\n", r.stats_error.c_str());
      break;
    }
  }

  // The chart, where python3 can import matplotlib.
  if (options.chart_script.empty()) {
    std::printf("chart: not drawn (compare_chart.py not found next to vmmshim)\n");
  } else {
    ChildSpec chart;
    chart.argv = {"python3", options.chart_script, json_path, out_dir + "/compare.png"};
    chart.env = base;
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
  if (any_without_shim) return 2;
  return any_failed ? 1 : 0;
}

}  // namespace vmmshim::compare

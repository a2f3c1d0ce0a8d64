#include "cli/run_options.h"

#include <unistd.h>

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>

#include "cli/command_line.h"
#include "nlohmann/json.hpp"

namespace vmmshim::cli {

absl::Span<const RunOption> RunOptions() {
  using F = RunOption::Form;
  static constexpr RunOption kOptions[] = {
      {"--policy", OptionKey::kPeerPolicy, "peer-access policy", F::kPolicy},
      {"--min-bytes", OptionKey::kPeerMinBytes, "threshold of the min-size policy (e.g. 1M)",
       F::kBytes},
      {"--config", OptionKey::kConfig, "peer-access rules file (TOML)", F::kExistingFile},
      {"--stats", OptionKey::kStatsFile, "write the JSON statistics here at exit (%p: pid)",
       F::kOutputPath},
      {"--snapshot", OptionKey::kSnapshotFile,
       "record the memory history and write a memory_viz snapshot here at exit (%p: pid; "
       "docs/memory-snapshots.md)",
       F::kOutputPath},
      {"--cache-limit", OptionKey::kCacheLimit, "bytes or percent kept for reuse (e.g. 25%)",
       F::kShimValue},
      {"--log-level", OptionKey::kLogLevel, "trace, debug, info, warn, error, off",
       F::kShimValue},
      {"--log-file", OptionKey::kLogFile, "log to this file (%p: pid)", F::kOutputPath},
  };
  return kOptions;
}

std::string Keyword(const RunOption& option) {
  std::string out = option.flag + 2;
  for (char& c : out) {
    if (c == '-') c = '_';
  }
  return out;
}

std::string RunOptionsJson() {
  nlohmann::json out = nlohmann::json::array();
  for (const RunOption& o : RunOptions()) {
    out.push_back({{"flag", o.flag},
                   {"keyword", Keyword(o)},
                   {"variable", Option(o.key).name},
                   {"help", o.help}});
  }
  return out.dump(1);
}

void RunOptionValues::AddTo(CLI::App* run) {
  const absl::Span<const RunOption> options = RunOptions();
  for (size_t i = 0; i < options.size(); ++i) {
    const RunOption& o = options[i];
    CLI::Option* added = run->add_option(o.flag, values_[i], o.help);
    switch (o.form) {
      case RunOption::Form::kPolicy:
        added->check(OneOf({"all", "none", "min-size", "rules"}));
        break;
      case RunOption::Form::kBytes:
        added->check(ByteCount());
        break;
      case RunOption::Form::kExistingFile:
        added->check(CLI::ExistingFile);
        break;
      case RunOption::Form::kShimValue:
        added->check(ShimOptionValue(o.key));
        break;
      case RunOption::Form::kOutputPath:
        break;
    }
  }
}

const std::string& RunOptionValues::Get(OptionKey key) const {
  const absl::Span<const RunOption> options = RunOptions();
  for (size_t i = 0; i < options.size(); ++i) {
    if (options[i].key == key) return values_[i];
  }
  static const std::string kNone;
  return kNone;
}

void RunOptionValues::MakeOutputPathsAbsolute() {
  const absl::Span<const RunOption> options = RunOptions();
  for (size_t i = 0; i < options.size(); ++i) {
    std::string& path = values_[i];
    if (options[i].form != RunOption::Form::kOutputPath || path.empty() || path[0] == '/') {
      continue;
    }
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) path = std::string(cwd) + "/" + path;
  }
}

void RunOptionValues::Export() const {
  const absl::Span<const RunOption> options = RunOptions();
  for (size_t i = 0; i < options.size(); ++i) {
    if (!values_[i].empty()) setenv(Option(options[i].key).name, values_[i].c_str(), 1);
  }
}

std::string PreloadWith(const std::string& value, const std::vector<std::string>& first) {
  auto real = [](const std::string& path) {
    char buf[PATH_MAX];
    return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
  };
  auto base = [](const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
  };
  auto same = [&](const std::string& a, const std::string& b) {
    return base(a) == base(b) || real(a) == real(b);
  };
  std::string out;
  auto add = [&](const std::string& entry) {
    if (!out.empty()) out += ':';
    out += entry;
  };
  for (const std::string& f : first) add(f);
  size_t start = 0;
  while (start < value.size()) {
    const size_t end = std::min(value.find_first_of(": ", start), value.size());
    const std::string entry = value.substr(start, end - start);
    start = end + 1;
    if (entry.empty()) continue;
    bool named = false;
    for (const std::string& f : first) named = named || same(entry, f);
    if (!named) add(entry);
  }
  return out;
}

}  // namespace vmmshim::cli

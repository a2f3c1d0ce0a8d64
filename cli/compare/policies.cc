// --policies and the environments of native and policy runs (compare.h).
// The VMMSHIM_* names come from the shim's options table (config/config.h).
#include <limits.h>
#include <stdlib.h>

#include <set>

#include "cli/compare/internal.h"
#include "config/config.h"
#include "config/rules_file.h"

namespace vmmshim::compare {
namespace {

std::string Var(OptionKey key) { return Option(key).name; }

// The variables a policy run sets itself.
bool SetByPolicyRun(const std::string& name) {
  static const std::set<std::string> kNames = {
      Var(OptionKey::kEnable),    Var(OptionKey::kPeerPolicy), Var(OptionKey::kPeerMinBytes),
      Var(OptionKey::kConfig),    Var(OptionKey::kStatsFile),  Var(OptionKey::kLogFile),
      Var(OptionKey::kLogLevel)};
  return kNames.count(name) != 0;
}

bool IsShimVariable(const std::string& name) {
  return StartsWith(name, std::string(kOptionPrefix));
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
    if (IsShimVariable(name)) continue;
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
    if (IsShimVariable(name) && SetByPolicyRun(name)) continue;
    env.push_back(e);
  }
  env.push_back("LD_PRELOAD=" + preload);
  auto set = [&](OptionKey key, const std::string& value) {
    env.push_back(Var(key) + "=" + value);
  };
  set(OptionKey::kPeerPolicy, policy.policy);
  if (!policy.min_bytes.empty()) set(OptionKey::kPeerMinBytes, policy.min_bytes);
  if (!policy.rules_file.empty()) set(OptionKey::kConfig, policy.rules_file);
  set(OptionKey::kStatsFile, stats_file);
  set(OptionKey::kLogFile, log_file);
  set(OptionKey::kLogLevel, "info");
  return env;
}

}  // namespace vmmshim::compare

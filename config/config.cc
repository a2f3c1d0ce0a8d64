#include "config/config.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

extern char** environ;

namespace vmmshim {
namespace {

constexpr absl::string_view kPrefix = "VMMSHIM_";

struct LevelName {
  const char* name;
  LogLevel level;
};
constexpr LevelName kLevels[] = {
    {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
    {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}, {"off", LogLevel::kOff},
};

bool ApplyEnable(absl::string_view value, int, Config* config) {
  return absl::SimpleAtob(value, &config->enable);
}

bool ApplyLogLevel(absl::string_view value, int, Config* config) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  for (const LevelName& l : kLevels) {
    if (lower == l.name || (lower == "warning" && l.level == LogLevel::kWarn)) {
      config->log_level = l.level;
      return true;
    }
  }
  return false;
}

bool ApplyLogFile(absl::string_view value, int pid, Config* config) {
  if (value.empty()) return false;
  config->log_file = absl::StrReplaceAll(value, {{"%p", absl::StrCat(pid)}});
  return true;
}

constexpr OptionInfo kOptions[] = {
    {"VMMSHIM_ENABLE", "bool", "1", "1/0, true/false, yes/no, t/f, y/n (any case)",
     "0 turns the shim into a pure pass-through: every call reaches the driver unchanged.",
     &ApplyEnable},
    {"VMMSHIM_LOG_LEVEL", "enum", "warn",
     "trace, debug, info, warn (or warning), error, off (any case)",
     "Least severe message logged. At info the shim logs its start and an exit report "
     "(allocations and bytes served from VMM and passed through).",
     &ApplyLogLevel},
    {"VMMSHIM_LOG_FILE", "path", "stderr",
     "a file path in an existing directory; %p becomes the pid",
     "Where log lines go, appended. A file that cannot be opened, or whose directory does not "
     "exist, gets one warning and logging stays on standard error.",
     &ApplyLogFile},
};

}  // namespace

absl::Span<const OptionInfo> Options() { return kOptions; }

absl::string_view LogLevelName(LogLevel level) {
  for (const LevelName& l : kLevels) {
    if (l.level == level) return l.name;
  }
  return "?";
}

ParseResult ParseConfig(absl::FunctionRef<const char*(const char*)> getenv,
                        absl::Span<const std::string> environ_names, int pid) {
  ParseResult result;
  for (const OptionInfo& option : kOptions) {
    const char* value = getenv(option.name);
    if (value == nullptr) continue;
    if (!option.apply(value, pid, &result.config)) {
      result.problems.push_back(absl::StrCat(option.name, "='", value, "' is not valid (",
                                             option.accepted, "); using the default ",
                                             option.default_value));
    }
  }
  for (const std::string& name : environ_names) {
    if (!absl::StartsWith(name, kPrefix)) continue;
    bool known = false;
    for (const OptionInfo& option : kOptions) known |= name == option.name;
    if (!known) {
      std::string names;
      for (const OptionInfo& option : kOptions) absl::StrAppend(&names, " ", option.name);
      result.problems.push_back(
          absl::StrCat(name, " is not a vmmshim option and is ignored; options are:", names));
    }
  }
  return result;
}

ParseResult ParseConfigFromEnvironment() {
  std::vector<std::string> names;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    if (absl::StartsWith(entry, kPrefix)) names.emplace_back(entry.substr(0, entry.find('=')));
  }
  return ParseConfig([](const char* name) { return std::getenv(name); }, names, getpid());
}

}  // namespace vmmshim

#include "config/rules_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cpptoml.h"

namespace vmmshim {
namespace {

// cpptoml keeps no source positions for values, so problems found after
// parsing are located by reading the text: the N-th [[rule]] header and the
// first line below it that assigns `key`.
class LineFinder {
 public:
  explicit LineFinder(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) lines_.push_back(line);
  }
  int RuleHeader(int index) const {
    int seen = -1;
    for (size_t i = 0; i < lines_.size(); ++i) {
      if (absl::StripLeadingAsciiWhitespace(lines_[i]).substr(0, 8) == "[[rule]]" &&
          ++seen == index) {
        return static_cast<int>(i) + 1;
      }
    }
    return 0;
  }
  // The line assigning `key` inside the table starting at `header` (1-based;
  // 0 = top level, where a [key] or [[key]] table header also counts), or
  // `header` (at least 1) when not found.
  int Key(int header, absl::string_view key) const {
    for (size_t i = header; i < lines_.size(); ++i) {
      absl::string_view l = absl::StripLeadingAsciiWhitespace(lines_[i]);
      if (absl::StartsWith(l, "[")) {
        if (header != 0) break;
        absl::string_view name = absl::StripAsciiWhitespace(absl::StripPrefix(
            absl::StripPrefix(l.substr(0, l.find(']')), "["), "["));
        if (name == key) return static_cast<int>(i) + 1;
        continue;
      }
      if (absl::ConsumePrefix(&l, key) &&
          absl::StartsWith(absl::StripLeadingAsciiWhitespace(l), "=")) {
        return static_cast<int>(i) + 1;
      }
    }
    return std::max(header, 1);
  }

 private:
  std::vector<std::string> lines_;
};

absl::Status Problem(const std::string& path, int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
}

}  // namespace

std::optional<size_t> ParseBytes(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(text[digits])) ++digits;
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &value)) return std::nullopt;
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(digits)));
  int shift = 0;
  if (!unit.empty() && unit != "b") {
    switch (unit[0]) {
      case 'k': shift = 10; break;
      case 'm': shift = 20; break;
      case 'g': shift = 30; break;
      case 't': shift = 40; break;
      default: return std::nullopt;
    }
    absl::string_view rest = absl::string_view(unit).substr(1);
    if (rest != "" && rest != "b" && rest != "ib") return std::nullopt;
  }
  if (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) return std::nullopt;
  return static_cast<size_t>(value << shift);
}

absl::StatusOr<PeerPolicy> LoadRulesFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open the rules file: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::shared_ptr<cpptoml::table> root;
  try {
    root = cpptoml::parse_file(path);
  } catch (const cpptoml::parse_exception& e) {
    // cpptoml says "PROBLEM at line N"; report it as FILE:N: PROBLEM.
    std::string what = e.what();
    const size_t at = what.rfind(" at line ");
    int line = 0;
    if (at != std::string::npos && absl::SimpleAtoi(what.substr(at + 9), &line)) {
      return Problem(path, line, what.substr(0, at));
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read the rules file: ", e.what()));
  }
  LineFinder lines(path);
  PeerPolicy policy;
  policy.kind = PeerPolicy::Kind::kRules;
  policy.rules_file = path;

  for (const auto& [key, value] : *root) {
    if (key != "default" && key != "rule") {
      return Problem(path, lines.Key(0, key),
                     absl::StrCat("unknown key '", key, "' (expected default or [[rule]])"));
    }
  }
  if (root->contains("default")) {
    auto d = root->get_as<std::string>("default");
    const std::string v = d ? absl::AsciiStrToLower(*d) : "";
    if (v != "allow" && v != "deny") {
      return Problem(path, lines.Key(0, "default"), "default must be \"allow\" or \"deny\"");
    }
    policy.default_allow = v == "allow";
  }
  if (root->contains("rule") && !root->get_table_array("rule")) {
    return Problem(path, lines.Key(0, "rule"), "rule must be written as [[rule]] tables");
  }
  std::vector<std::shared_ptr<cpptoml::table>> rule_tables;
  if (auto array = root->get_table_array("rule")) {
    for (const auto& t : *array) rule_tables.push_back(t);
  }
  int index = 0;
  for (const std::shared_ptr<cpptoml::table>& t : rule_tables) {
    const int header = lines.RuleHeader(index++);
    PeerRule rule;
    rule.line = header;
    auto where = [&](absl::string_view key) { return lines.Key(header, key); };
    for (const auto& [key, value] : *t) {
      if (key != "owner" && key != "peer" && key != "min_size" && key != "max_size" &&
          key != "tag" && key != "action") {
        return Problem(path, where(key),
                       absl::StrCat("unknown key '", key,
                                    "' in [[rule]] (owner, peer, min_size, max_size, tag, "
                                    "action)"));
      }
    }
    auto device = [](int64_t v) { return v >= 0 && v < kMaxDevices; };
    const std::string peer_range = absl::StrCat("peer must be 0..", kMaxDevices - 1);
    if (t->contains("owner")) {
      auto owner = t->get_as<int64_t>("owner");
      if (!owner || !device(*owner)) {
        return Problem(path, where("owner"),
                       absl::StrCat("owner must be a device ordinal 0..", kMaxDevices - 1));
      }
      rule.owner = static_cast<int>(*owner);
    }
    if (t->contains("peer")) {
      if (auto one = t->get_as<int64_t>("peer")) {
        if (!device(*one)) return Problem(path, where("peer"), peer_range);
        rule.peers.push_back(static_cast<int>(*one));
      } else if (auto many = t->get_array_of<int64_t>("peer")) {
        if (many->empty()) {
          return Problem(path, where("peer"),
                         "peer list is empty (omit peer to match every peer)");
        }
        for (int64_t p : *many) {
          if (!device(p)) return Problem(path, where("peer"), peer_range);
          rule.peers.push_back(static_cast<int>(p));
        }
      } else {
        return Problem(path, where("peer"), "peer must be a device ordinal or a list of them");
      }
    }
    for (const char* key : {"min_size", "max_size"}) {
      if (!t->contains(key)) continue;
      std::optional<size_t> bytes;
      if (auto n = t->get_as<int64_t>(key)) {
        if (*n >= 0) bytes = static_cast<size_t>(*n);
      } else if (auto s = t->get_as<std::string>(key)) {
        bytes = ParseBytes(*s);
      }
      if (!bytes) {
        return Problem(path, where(key),
                       absl::StrCat(key, " must be a byte count such as 4096, \"64K\" or "
                                         "\"1MiB\""));
      }
      (std::string(key) == "min_size" ? rule.min_bytes : rule.max_bytes) = *bytes;
    }
    if (rule.min_bytes > rule.max_bytes) {
      return Problem(path, where("max_size"), "max_size is below min_size");
    }
    if (t->contains("tag")) {
      auto tag = t->get_as<std::string>("tag");
      if (!tag) return Problem(path, where("tag"), "tag must be a string");
      rule.tag = *tag;
    }
    if (!t->contains("action")) {
      return Problem(path, header, "this [[rule]] has no action (\"allow\" or \"deny\")");
    }
    auto action = t->get_as<std::string>("action");
    const std::string a = action ? absl::AsciiStrToLower(*action) : "";
    if (a != "allow" && a != "deny") {
      return Problem(path, where("action"), "action must be \"allow\" or \"deny\"");
    }
    rule.allow = a == "allow";
    policy.rules.push_back(std::move(rule));
  }
  return policy;
}

}  // namespace vmmshim

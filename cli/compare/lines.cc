// Which lines of a run's standard output are compared, and how two runs'
// lines differ (compare.h: LineFilter, LinesDifference).
#include <regex.h>

#include <algorithm>
#include <utility>

#include "cli/compare/internal.h"

namespace vmmshim::compare {
namespace {

// `text` split at "\n", a "\r" before it dropped.
std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines = Split(text, '\n');
  for (std::string& l : lines) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
  }
  return lines;
}

// At most 100 characters of `line` around position `at` (where two lines
// first differ), with "..." where it was cut, so the difference shows.
std::string Around(const std::string& line, size_t at) {
  if (line.size() <= 100) return line;
  const size_t from = at > 40 ? std::min(at - 40, line.size() - 94) : 0;
  const size_t n = std::min<size_t>(94, line.size() - from);
  return (from > 0 ? "..." : "") + line.substr(from, n) + (from + n < line.size() ? "..." : "");
}

}  // namespace

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
  std::vector<std::string> lines = SplitLines(out);
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
                            const std::vector<std::string>& got, bool filtered,
                            const std::vector<size_t>& ignored) {
  const char* what = filtered ? "checked line" : "line";
  for (size_t i = 0; i < std::min(want.size(), got.size()); ++i) {
    if (want[i] != got[i] && !std::binary_search(ignored.begin(), ignored.end(), i)) {
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

VaryingLines::VaryingLines(std::vector<std::string> reference)
    : reference_(std::move(reference)) {
  for (Tally* t : {&all_, &counted_}) {
    t->varies.assign(reference_.size(), false);
    t->texts.resize(reference_.size());
  }
}

void VaryingLines::Add(Tally* t, const std::vector<std::string>& lines) const {
  if (!t->aligned) return;
  if (lines.size() != reference_.size()) {
    t->aligned = false;
    t->counts.push_back(lines.size());
    return;
  }
  ++t->runs;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i] == reference_[i]) continue;
    t->varies[i] = true;
    std::vector<std::string>& texts = t->texts[i];
    if (texts.empty()) texts.push_back(reference_[i]);
    if (texts.size() < kTextsKept &&
        std::find(texts.begin(), texts.end(), lines[i]) == texts.end()) {
      texts.push_back(lines[i]);
    }
  }
}

void VaryingLines::Learn(const std::vector<std::string>& lines, bool warmup) {
  Add(&all_, lines);
  if (!warmup) Add(&counted_, lines);
}

const VaryingLines::Tally& VaryingLines::Chosen() const {
  if (all_.aligned) return all_;
  static const Tally kNothing;  // every line compared
  return counted_.aligned ? counted_ : kNothing;
}

std::vector<size_t> VaryingLines::Positions() const {
  std::vector<size_t> positions;
  const Tally& t = Chosen();
  for (size_t i = 0; i < t.varies.size(); ++i) {
    if (t.varies[i]) positions.push_back(i);
  }
  return positions;
}

std::vector<std::string> VaryingLines::Texts(size_t position) const {
  const Tally& t = Chosen();
  return position < t.texts.size() ? t.texts[position] : std::vector<std::string>();
}

int VaryingLines::runs() const { return Chosen().runs; }

std::string VaryingLines::caveat() const {
  auto counts = [](const std::vector<size_t>& c) {
    std::string text;
    for (size_t n : c) text += (text.empty() ? "" : ", ") + std::to_string(n);
    return text;
  };
  const std::string ref = std::to_string(reference_.size());
  if (!counted_.aligned) {
    return "the counted native runs printed different numbers of lines (" + ref + ", " +
           counts(counted_.counts) +
           "), so they cannot be lined up: no line left out, every line compared";
  }
  if (!all_.aligned) {
    return "a warm-up native run printed " + counts(all_.counts) + " lines, the counted ones " +
           ref + ": varying lines learnt from the counted runs only";
  }
  return "";
}

}  // namespace vmmshim::compare

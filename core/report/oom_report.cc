#include "core/report/oom_report.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace vmmshim {
namespace {

struct Live {
  CUdeviceptr address;
  uint64_t bytes;
  std::string tag;
  uint16_t origin;
};

// "a 1.0 GiB, b 2.0 MiB" in decreasing order of bytes.
std::string Ranked(const std::map<std::string, uint64_t>& totals) {
  std::vector<std::pair<std::string, uint64_t>> v(totals.begin(), totals.end());
  std::stable_sort(v.begin(), v.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::string> parts;
  for (const auto& [name, bytes] : v) parts.push_back(absl::StrCat(name, " ", HumanBytes(bytes)));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " bytes");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, units[u]);
}

std::string OomReport(const MemoryControl& control, const CallerLibraries* libraries,
                      const OomRequest& r, int largest) {
  auto library = [&](uint16_t id) {
    return libraries != nullptr ? libraries->Name(id) : std::string("unknown");
  };
  std::vector<std::string> lines;
  std::string request = absl::StrCat("out of memory: ", r.entry_point.empty() ? "" : r.entry_point,
                                     r.entry_point.empty() ? "" : " of ", HumanBytes(r.bytes),
                                     " on device ", r.device, " (",
                                     r.tag.empty() ? "untagged" : absl::StrCat("tag \"", r.tag, "\""),
                                     ", from ", library(r.library), ")");
  lines.push_back(request);
  if (r.device_total > 0) {
    lines.push_back(absl::StrCat("the driver reports ", HumanBytes(r.device_free), " free of ",
                                 HumanBytes(r.device_total), " after vmmshim released its cache"));
  }

  // Kinds, from the residency figures of the device.
  DeviceResidency residency;
  for (DeviceResidency& d : control.Residency()) {
    if (d.device == r.device) residency = std::move(d);
  }
  uint64_t live_blocks = 0, paused = 0;
  for (const auto& [tag, t] : residency.tags) {
    live_blocks += t.resident_bytes;
    paused += t.paused_bytes;
  }
  const uint64_t other_vmm = residency.other_vmm_bytes();
  const uint64_t held = live_blocks + residency.cached_bytes + residency.orphan_bytes +
                        residency.passed_through_bytes + other_vmm;

  // Live allocations, from the segments of the device.
  std::vector<Live> live;
  std::map<std::string, uint64_t> by_tag, by_library;
  for (const SegmentInfo& s : control.Segments()) {
    if (s.device != r.device) continue;
    for (const SegmentPart& p : s.parts) {
      if (!p.live) continue;
      live.push_back({s.address + p.offset, p.requested, s.tag, p.origin});
      by_tag[s.tag.empty() ? "(untagged)" : s.tag] += p.requested;
      by_library[library(p.origin)] += p.requested;
    }
  }

  lines.push_back(absl::StrCat("  held by this process on device ", r.device, ": ",
                               HumanBytes(held)));
  auto kind = [&](const char* name, uint64_t bytes, const std::string& note = "") {
    lines.push_back(absl::StrFormat("    %-28s %12s%s", name, HumanBytes(bytes), note));
  };
  kind("live allocations (blocks)", live_blocks,
       absl::StrCat("  ", live.size(), " allocation(s)"));
  kind("cached for reuse", residency.cached_bytes);
  kind("stream-ordered cache", residency.stream_ordered_cached_bytes,
       "  (of the live blocks: freed, waiting for their stream)");
  kind("passed through to the driver", residency.passed_through_bytes);
  kind("other libraries' VMM memory", other_vmm);
  if (residency.orphan_bytes > 0) kind("release pending", residency.orphan_bytes);
  kind("paused", paused, "  (released: not device memory now)");
  lines.push_back(absl::StrCat("  by tag: ", Ranked(by_tag)));
  lines.push_back(absl::StrCat("  by library: ", Ranked(by_library)));

  std::stable_sort(live.begin(), live.end(),
                   [](const Live& a, const Live& b) { return a.bytes > b.bytes; });
  if (!live.empty() && largest > 0) {
    lines.push_back("  largest live allocations:");
    for (size_t i = 0; i < live.size() && i < static_cast<size_t>(largest); ++i) {
      const Live& l = live[i];
      lines.push_back(absl::StrFormat("    %#014x %12s  %s  %s", l.address, HumanBytes(l.bytes),
                                      l.tag.empty() ? "untagged" : absl::StrCat("tag ", l.tag),
                                      library(l.origin)));
    }
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace vmmshim

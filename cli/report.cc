#include "cli/report.h"

#include <cstdarg>
#include <cstdio>

#include "cli/format.h"
#include "nlohmann/json.hpp"

namespace vmmshim::cli {
namespace {

void Append(std::string* out, const char* format, ...) __attribute__((format(printf, 2, 3)));
void Append(std::string* out, const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (n > 0) {
    const size_t at = out->size();
    out->resize(at + static_cast<size_t>(n) + 1);
    std::vsnprintf(&(*out)[at], static_cast<size_t>(n) + 1, format, args);
    out->resize(at + static_cast<size_t>(n));
  }
  va_end(args);
}

unsigned long long U(uint64_t v) { return static_cast<unsigned long long>(v); }

}  // namespace

std::string FormatReport(const StatsFile& s, const std::string& path) {
  std::string out;
  const StatsTotals& t = s.totals;
  Append(&out, "vmmshim statistics of pid %d (%s, written by vmmshim %s)\npolicy: %s\n\n", s.pid,
         path.c_str(), s.version.c_str(), s.policy.c_str());
  Append(&out,
         "served %llu allocations (%s) from VMM, passed %llu (%s) through; %llu still live; "
         "peak physical memory %s\n\n",
         U(t.served_allocations), FormatBytes(t.served_bytes).c_str(),
         U(t.passthrough_allocations), FormatBytes(t.passthrough_bytes).c_str(),
         U(t.live_allocations), FormatBytes(t.peak_physical_bytes).c_str());
  Append(&out, "%-7s %12s %12s %14s %14s %10s %10s %10s\n", "device", "allocations", "bytes",
         "peak live", "peak physical", "setaccess", "cache-hits", "misses");
  for (const StatsDevice& d : s.devices) {
    Append(&out, "%-7d %12llu %12s %14s %14s %10llu %10llu %10llu\n", d.device, U(d.allocations),
           FormatBytes(d.bytes).c_str(), FormatBytes(d.peak_live_bytes).c_str(),
           FormatBytes(d.peak_physical_bytes).c_str(), U(d.set_access_calls), U(d.cache_hits),
           U(d.cache_misses));
  }
  bool any_peer = false;
  for (const StatsDevice& d : s.devices) any_peer |= !d.peers.empty();
  if (any_peer) {
    Append(&out, "\n%-7s %-5s %10s %10s %16s %16s\n", "device", "peer", "grants", "denials",
           "mapped at exit", "peak mapped");
  } else {
    Append(&out, "\npeers: none recorded (no grants, denials or mappings)\n");
  }
  for (const StatsDevice& d : s.devices) {
    for (const StatsPeer& p : d.peers) {
      Append(&out, "%-7d %-5d %10llu %10llu %16s %16s\n", d.device, p.peer, U(p.grants),
             U(p.denials), FormatBytes(p.mapped_bytes).c_str(),
             FormatBytes(p.peak_mapped_bytes).c_str());
    }
  }
  if (!s.driver_calls.empty()) {
    Append(&out, "\n%-32s %10s %12s\n", "driver entry point", "calls", "seconds");
    for (const StatsDriverCall& c : s.driver_calls) {
      Append(&out, "%-32s %10llu %12.6f\n", c.entry.c_str(), U(c.calls), c.seconds);
    }
  }
  return out;
}

namespace {

// What a multi-process report adds up per process.
struct ProcessFigures {
  uint64_t served = 0, served_bytes = 0, live = 0, live_bytes = 0, peak_physical = 0;
  uint64_t paused_bytes = 0, passthrough = 0, grants = 0, denials = 0, peak_mapped = 0;

  void Add(const ProcessFigures& o) {
    served += o.served;
    served_bytes += o.served_bytes;
    live += o.live;
    live_bytes += o.live_bytes;
    peak_physical += o.peak_physical;
    paused_bytes += o.paused_bytes;
    passthrough += o.passthrough;
    grants += o.grants;
    denials += o.denials;
    peak_mapped += o.peak_mapped;
  }
};

ProcessFigures FiguresOf(const StatsFile& s) {
  ProcessFigures f;
  f.served = s.totals.served_allocations;
  f.served_bytes = s.totals.served_bytes;
  f.live = s.totals.live_allocations;
  f.live_bytes = s.totals.live_bytes;
  f.peak_physical = s.totals.peak_physical_bytes;
  f.paused_bytes = s.totals.paused_bytes;
  f.passthrough = s.totals.passthrough_allocations;
  for (const StatsDevice& d : s.devices) {
    for (const StatsPeer& p : d.peers) {
      f.grants += p.grants;
      f.denials += p.denials;
      f.peak_mapped += p.peak_mapped_bytes;
    }
  }
  return f;
}

void AppendProcessRow(std::string* out, const std::string& who, const ProcessFigures& f) {
  Append(out, "%-9s %8llu %11s %6llu %11s %11s %7llu %7llu %11s %7llu\n", who.c_str(),
         U(f.served), FormatBytes(f.served_bytes).c_str(), U(f.live),
         FormatBytes(f.peak_physical).c_str(), FormatBytes(f.paused_bytes).c_str(), U(f.grants),
         U(f.denials), FormatBytes(f.peak_mapped).c_str(), U(f.passthrough));
}

nlohmann::json FiguresJson(const ProcessFigures& f) {
  return {{"served_allocations", f.served},   {"served_bytes", f.served_bytes},
          {"live_allocations", f.live},       {"live_bytes", f.live_bytes},
          {"peak_physical_bytes", f.peak_physical}, {"paused_bytes", f.paused_bytes},
          {"passthrough_allocations", f.passthrough}, {"grants", f.grants},
          {"denials", f.denials},             {"peak_mapped_bytes", f.peak_mapped}};
}

}  // namespace

std::string FormatProcesses(const std::vector<ProcessStats>& processes) {
  std::string out;
  Append(&out, "vmmshim statistics of %zu processes\n\n", processes.size());
  Append(&out, "%-9s %8s %11s %6s %11s %11s %7s %7s %11s %7s\n", "pid", "served", "bytes",
         "live", "peak phys", "paused", "grants", "denials", "peer-mapped", "passed");
  ProcessFigures total;
  for (const ProcessStats& p : processes) {
    const ProcessFigures f = FiguresOf(p.stats);
    AppendProcessRow(&out, std::to_string(p.stats.pid), f);
    total.Add(f);
  }
  AppendProcessRow(&out, "total", total);
  Append(&out,
         "\n- bytes: served from VMM; live: allocations not freed at exit; peak phys: each\n"
         "  process's peak physical memory (the total adds them up: at least the job's peak);\n"
         "  peer-mapped: peak bytes mapped into peers; passed: allocations passed through.\n");
  for (const ProcessStats& p : processes) {
    // The policy's name, without its description.
    const std::string policy = p.stats.policy.substr(0, p.stats.policy.find(" ("));
    Append(&out, "- %d: %s (vmmshim %s, policy %s)\n", p.stats.pid, p.path.c_str(),
           p.stats.version.c_str(), policy.c_str());
  }
  return out;
}

std::string ProcessesJson(const std::vector<ProcessStats>& processes) {
  nlohmann::json doc = {{"processes", nlohmann::json::array()}};
  ProcessFigures total;
  for (const ProcessStats& p : processes) {
    const ProcessFigures f = FiguresOf(p.stats);
    total.Add(f);
    doc["processes"].push_back({{"path", p.path},
                                {"pid", p.stats.pid},
                                {"version", p.stats.version},
                                {"policy", p.stats.policy},
                                {"figures", FiguresJson(f)}});
  }
  doc["totals"] = FiguresJson(total);
  return doc.dump(2) + "\n";
}

}  // namespace vmmshim::cli

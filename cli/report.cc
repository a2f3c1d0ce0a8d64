#include "cli/report.h"

#include <cstdarg>
#include <cstdio>

#include "cli/format.h"

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

}  // namespace vmmshim::cli

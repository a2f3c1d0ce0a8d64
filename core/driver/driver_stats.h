// Counting and timing of driver calls, for the statistics report.
//
// InstrumentDriverApi() returns a DriverApi whose every entry calls the
// original entry and adds one call and its duration (steady clock) to a
// per-entry counter. It is used only when a statistics file is requested, so
// the ordinary hot path pays nothing. The counters are process-wide (the
// thunks are plain functions, which cannot carry state): instrumenting twice
// replaces the entries the thunks forward to.
//
// Thread safety: counters are atomics; InstrumentDriverApi must not race
// with calls through a previously instrumented table.
#ifndef VMMSHIM_CORE_DRIVER_DRIVER_STATS_H_
#define VMMSHIM_CORE_DRIVER_DRIVER_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/driver/driver_api.h"

namespace vmmshim {

DriverApi InstrumentDriverApi(const DriverApi& real);

struct DriverCallCount {
  std::string entry;  // the exported symbol name
  uint64_t calls = 0;
  double seconds = 0;
};

// Entries called at least once, in table order.
std::vector<DriverCallCount> DriverCallCounts();

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_DRIVER_DRIVER_STATS_H_

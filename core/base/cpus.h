// How many threads the shim's own parallel work uses by default (heap arenas
// per device, pause copy threads): the CPUs this process may run on
// (sched_getaffinity, so a container's or taskset's limit counts), at least
// 1 and at most `limit`. More arenas than threads allocating at once only
// spread small allocations over more granules; copy threads: up to 16
// copied faster (docs/performance.md, "Measurements behind the design",
// "Host backups").
#ifndef VMMSHIM_CORE_BASE_CPUS_H_
#define VMMSHIM_CORE_BASE_CPUS_H_

#include <sched.h>

#include <algorithm>

namespace vmmshim {

inline int UsableCpusUpTo(int limit) {
  cpu_set_t set;
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::clamp(cpus, 1, std::max(1, limit));
}

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_BASE_CPUS_H_

// How much host memory this process may still take without the kernel's
// OOM killer ending it: the smaller of the machine's MemAvailable
// (/proc/meminfo) and the headroom of the process's memory cgroup
// (cgroup v2 memory.max - memory.current, or v1 memory.limit_in_bytes -
// memory.usage_in_bytes, of the cgroup /proc/self/cgroup names, and of each
// cgroup above it). Read before memory is pinned or backed up, so that a
// pool or a backup too large for a container is cut or refused with a
// reason instead of an OOM kill (page-locked memory cannot be reclaimed).
//
// Thread safety: any thread; reads files each call (microseconds).
#ifndef VMMSHIM_CORE_BASE_HOST_MEMORY_H_
#define VMMSHIM_CORE_BASE_HOST_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace vmmshim {

struct HostMemoryHeadroom {
  size_t bytes = SIZE_MAX;  // SIZE_MAX: nothing could be read
  // What set `bytes`, in words: "MemAvailable" or "the memory cgroup
  // /sys/fs/cgroup/x (limit L bytes, U in use)".
  std::string limited_by = "nothing known";
};

HostMemoryHeadroom HostMemoryHeadroomNow();

// The same read under `root` in place of "/" (tests plant a /proc and a
// /sys/fs/cgroup there).
HostMemoryHeadroom HostMemoryHeadroomUnder(const std::string& root);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_BASE_HOST_MEMORY_H_

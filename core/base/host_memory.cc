#include "core/base/host_memory.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace vmmshim {
namespace {

// The first line of `path` as a byte count; nullopt when missing or "max".
std::optional<uint64_t> ReadBytes(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  uint64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &v)) return std::nullopt;
  return v;
}

std::optional<uint64_t> MemAvailable(const std::string& root) {
  std::ifstream in(root + "/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return kib << 10;
  }
  return std::nullopt;
}

void Consider(uint64_t bytes, std::string why, HostMemoryHeadroom* h) {
  if (bytes < h->bytes) {
    h->bytes = static_cast<size_t>(bytes);
    h->limited_by = std::move(why);
  }
}

// Each memory cgroup from the process's own up to the root, v2 and v1.
void ConsiderCgroups(const std::string& root, HostMemoryHeadroom* h) {
  std::ifstream in(root + "/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "0::/path" (v2) or "N:memory:/path" or "N:cpu,memory:/path" (v1).
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool v2 = controllers.empty();
    if (!v2 && ("," + controllers + ",").find(",memory,") == std::string::npos) continue;
    const std::string base = root + (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory");
    for (;;) {
      const std::string dir = base + (path == "/" ? "" : path);
      const std::optional<uint64_t> limit =
          ReadBytes(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
      const std::optional<uint64_t> used =
          ReadBytes(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
      // v1 writes "no limit" as a number near 2^63.
      if (limit && used && *limit < (uint64_t{1} << 60)) {
        const uint64_t headroom = *limit > *used ? *limit - *used : 0;
        Consider(headroom,
                 absl::StrCat("the memory cgroup ", dir.substr(root.size()), " (limit ", *limit,
                              " bytes, ", *used, " in use)"),
                 h);
      }
      if (path.empty() || path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
  }
}

}  // namespace

HostMemoryHeadroom HostMemoryHeadroomUnder(const std::string& root) {
  HostMemoryHeadroom h;
  if (std::optional<uint64_t> available = MemAvailable(root)) {
    Consider(*available, "MemAvailable of /proc/meminfo", &h);
  }
  ConsiderCgroups(root, &h);
  return h;
}

HostMemoryHeadroom HostMemoryHeadroomNow() { return HostMemoryHeadroomUnder(""); }

}  // namespace vmmshim

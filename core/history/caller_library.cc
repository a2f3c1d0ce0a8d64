#include "core/history/caller_library.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/base/attributes.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace vmmshim {
namespace {

// How far above the hook's frame the scan looks (bytes): the frames of
// cudaMalloc and the driver entry below the caller's return address take a
// few hundred bytes; 4 KiB leaves room and bounds the cost.
constexpr size_t kScanBytes = 4096;

// The end (highest address) of the calling thread's stack, or 0 when
// unknown; asked once per thread.
uintptr_t StackEnd() {
  thread_local uintptr_t end = [] {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return uintptr_t{0};
    void* base = nullptr;
    size_t size = 0;
    const int r = pthread_attr_getstack(&attr, &base, &size);
    pthread_attr_destroy(&attr);
    return r == 0 ? reinterpret_cast<uintptr_t>(base) + size : uintptr_t{0};
  }();
  return end;
}

// Whether the bytes before `address` (inside a text segment that starts at
// `text_begin`) encode a call that returns to it. x86-64: a direct call
// (E8 rel32) or an indirect one (FF /2, 2 to 7 bytes long). Elsewhere every
// address in a text segment is taken.
bool FollowsCall(uintptr_t address, uintptr_t text_begin) {
#if defined(__x86_64__)
  if (address < text_begin + 7) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(address);
  if (p[-5] == 0xe8) return true;
  for (int length = 2; length <= 7; ++length) {
    if (p[-length] == 0xff && ((p[-length + 1] >> 3) & 7) == 2) return true;
  }
  return false;
#else
  (void)address;
  (void)text_begin;
  return true;
#endif
}

size_t Slot(uintptr_t address, size_t slots) {
  return ((address >> 4) ^ (address >> 16)) & (slots - 1);
}

}  // namespace

std::string CallerLibraries::NameOfPath(absl::string_view path) {
  if (path.empty()) return "unknown";
  absl::string_view base = path.substr(path.rfind('/') + 1);
  // A Python extension module: its package path after site-/dist-packages.
  if (size_t cpython = base.find(".cpython-"); cpython != absl::string_view::npos) {
    absl::string_view rest = path.substr(0, path.size() - base.size());
    bool in_package = false;
    for (absl::string_view root : {"site-packages/", "dist-packages/"}) {
      if (size_t at = rest.rfind(root); at != absl::string_view::npos) {
        rest = rest.substr(at + root.size());
        in_package = true;
        break;
      }
    }
    // Python's own modules (lib-dynload): the module alone.
    if (!in_package) rest = "";
    std::vector<absl::string_view> parts = absl::StrSplit(rest, '/', absl::SkipEmpty());
    if (parts.size() > 4) parts.erase(parts.begin(), parts.end() - 4);  // a long package path
    parts.push_back(base.substr(0, cpython));
    return absl::StrJoin(parts, ".");
  }
  if (size_t so = base.find(".so"); so != absl::string_view::npos && so > 0) {
    return std::string(base.substr(0, so));
  }
  return std::string(base);
}

bool CallerLibraries::IsRuntimeLibrary(absl::string_view name) {
  return name == "libcudart" || name == "libcuda" || name == "libvmmshim";
}

CallerLibraries::CallerLibraries() {
  MutexLock lock(&mu_);
  names_.push_back("unknown");
}

const CallerLibraries::Text* CallerLibraries::TextTable::Find(uintptr_t address) const {
  if (address < lowest || address >= highest) return nullptr;
  auto it = std::upper_bound(texts.begin(), texts.end(), address,
                             [](uintptr_t a, const Text& t) { return a < t.begin; });
  if (it == texts.begin()) return nullptr;
  --it;
  return address < it->end ? &*it : nullptr;
}

uint16_t CallerLibraries::Resolve(const void* return_address, const void* stack) {
  const auto ra = reinterpret_cast<uintptr_t>(return_address);
  std::atomic<uint64_t>& slot = cache_[Slot(ra, kCacheSlots)];
  uint64_t entry = slot.load(std::memory_order_relaxed);
  if (entry == 0 || (entry >> 16) != ra) {
    const uint16_t id = ResolveSlow(ra);
    entry = (static_cast<uint64_t>(ra) << 16) | id;
    slot.store(entry, std::memory_order_relaxed);
  }
  const auto id = static_cast<uint16_t>(entry & 0xffff);
  if ((id & kRuntimePath) == 0) return id;
  const auto hint = static_cast<uint16_t>(id & ~kRuntimePath);
  uint16_t found = kNoHint;
  const uint16_t caller = ScanStack(stack, hint, &found);
  if (found != hint) {
    slot.store((static_cast<uint64_t>(ra) << 16) | kRuntimePath | found,
               std::memory_order_relaxed);
  }
  return caller;
}

uint16_t CallerLibraries::ResolveSlow(uintptr_t return_address) {
  MutexLock lock(&mu_);
  const TextTable* table = table_.load(std::memory_order_acquire);
  const Text* text = table != nullptr ? table->Find(return_address) : nullptr;
  if (text == nullptr) {
    RefreshLocked();  // a call site in an object loaded since the last look
    text = table_.load(std::memory_order_acquire)->Find(return_address);
  }
  if (text == nullptr) return kUnknown;
  return text->runtime ? (kRuntimePath | kNoHint) : text->id;
}

// Reads other frames' words, which AddressSanitizer would call overflows.
ABSL_ATTRIBUTE_NO_SANITIZE_ADDRESS
uint16_t CallerLibraries::ScanStack(const void* stack, uint16_t hint, uint16_t* found) {
  *found = kNoHint;
  const TextTable* table = table_.load(std::memory_order_acquire);
  const uintptr_t end = StackEnd();
  const uintptr_t first = reinterpret_cast<uintptr_t>(stack) & ~uintptr_t{7};
  if (table == nullptr || end == 0 || first >= end) return kUnknown;
  const uintptr_t limit = std::min(end, first + kScanBytes);
  // The object `value` returns into after a call, when not a runtime; else
  // null. (The stack is read here, not in the lambda, which the sanitizer
  // attribute of this function does not cover.)
  auto caller_of = [&](uintptr_t value) -> const Text* {
    if (value < table->lowest || value >= table->highest) return nullptr;
    const Text* text = table->Find(value);
    if (text == nullptr || text->runtime || !FollowsCall(value, text->begin)) return nullptr;
    return text;
  };
  if (hint != kNoHint) {
    const uintptr_t word = first + hint * sizeof(uintptr_t);
    if (word + sizeof(uintptr_t) <= limit) {
      if (const Text* text = caller_of(*reinterpret_cast<const uintptr_t*>(word))) {
        *found = hint;
        return text->id;
      }
    }
  }
  for (uintptr_t word = first; word + sizeof(uintptr_t) <= limit; word += sizeof(uintptr_t)) {
    if (const Text* text = caller_of(*reinterpret_cast<const uintptr_t*>(word))) {
      *found = static_cast<uint16_t>((word - first) / sizeof(uintptr_t));
      return text->id;
    }
  }
  return kUnknown;
}

uint16_t CallerLibraries::InternLocked(const std::string& name) {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return static_cast<uint16_t>(i);
  }
  if (names_.size() >= kRuntimePath) return kUnknown;  // 32,767 distinct objects: no more names
  names_.push_back(name);
  return static_cast<uint16_t>(names_.size() - 1);
}

void CallerLibraries::RefreshLocked() {
  // Collected first, interned after: the callback runs under the loader's
  // lock and knows nothing of ours.
  struct Segment {
    std::string name;
    uintptr_t begin, end;
  };
  std::vector<Segment> segments;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* out = static_cast<std::vector<Segment>*>(data);
        std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (path.empty()) {
          // The main program: its path from /proc/self/exe.
          char exe[4096];
          const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
          if (n > 0) path.assign(exe, static_cast<size_t>(n));
        }
        if (absl::StartsWith(path, "linux-vdso")) return 0;
        const std::string name = NameOfPath(path);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
          const uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
          out->push_back({name, begin, begin + ph.p_memsz});
        }
        return 0;
      },
      &segments);
  auto table = std::make_unique<TextTable>();
  for (const Segment& s : segments) {
    Text t;
    t.begin = s.begin;
    t.end = s.end;
    t.id = InternLocked(s.name);
    t.runtime = IsRuntimeLibrary(s.name);
    table->texts.push_back(t);
  }
  std::sort(table->texts.begin(), table->texts.end(),
            [](const Text& a, const Text& b) { return a.begin < b.begin; });
  if (!table->texts.empty()) {
    table->lowest = table->texts.front().begin;
    for (const Text& t : table->texts) table->highest = std::max(table->highest, t.end);
  }
  table_.store(table.get(), std::memory_order_release);
  tables_.push_back(std::move(table));
}

std::string CallerLibraries::Name(uint16_t id) const {
  MutexLock lock(&mu_);
  return id < names_.size() ? names_[id] : names_[0];
}

std::vector<std::string> CallerLibraries::Names() const {
  MutexLock lock(&mu_);
  return names_;
}

}  // namespace vmmshim

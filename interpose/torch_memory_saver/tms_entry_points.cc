// libvmmshim_tms.so: the C entry points of torch_memory_saver's preload
// library (its csrc/entrypoint.cpp: tms_pause, tms_resume, the region
// state's setters and getters), served by vmmshim's C API
// (include/vmmshim/vmmshim.h), for programs written for torch_memory_saver
// that bind them with ctypes (`ctypes.CDLL(None).tms_pause`). Preloaded
// after libvmmshim.so by `vmmshim run --torch-memory-saver` and by the
// drop-in's configure_subprocess(); the drop-in's Python
// (python/vmmshim/torch_memory_saver.py) drives the same state through
// these calls, so that both see one truth.
//
// The region state is per thread, as torch_memory_saver's: whether
// allocations are "interesting" (made inside a region), the region's tag,
// whether its contents are kept (cpu backup, with the backend "pinned" or
// "mmap", or disk backup). A thread starts from the environment:
// TMS_INIT_ENABLE=1 (inside the region "default"), TMS_INIT_ENABLE_CPU_BACKUP=1,
// TMS_INIT_CPU_BACKUP_BACKEND (pinned, the default, or mmap); with
// TMS_INIT_ENABLE, threads that never touch the state are inside "default"
// too (vmmshim_set_default_allocation_tag at load). TMS_RETAIN_CPU_BACKUP=1
// starts the process-wide retain setting on.
//
// Each state is one vmmshim allocation tag ("tms:TAG", "tms:TAG:cpu-backup",
// "tms:TAG:cpu-backup:mmap", "tms:TAG:disk-backup"), set as the thread's
// tag whenever the state changes; outside regions, untagged. A pause of a
// torch_memory_saver tag (NULL: every one) pauses the vmmshim tags made for
// it so far, contents kept as each asks:
//   - pinned: the host copy page-locked when it will be retained (the
//     retain setting is on at the pause), so that it is pinned once and
//     copied at the copy engine's speed from then on; a copy dropped at the
//     resume is pageable (the staging ring's path is faster than pinning new
//     memory at every pause);
//   - mmap: pageable anonymous memory (resident while paused, given back at
//     a resume that does not retain it);
//   - disk: a file per block in the directory of tms_set_disk_backup_dir.
// A resume with the retain setting on keeps the host copies at their
// addresses; the next pause writes them again in place.
//
// Errors: tms_pause and tms_resume return nothing (as torch_memory_saver's);
// a failure is logged on stderr and kept for vmmshim_tms_last_error (the
// drop-in raises it). Thread safety: any thread; the registry of tags and
// the settings are under one mutex.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "vmmshim/vmmshim.h"

#define TMS_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

bool EnvOn(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

struct RegionState {
  bool interesting = false;
  bool cpu_backup = false;
  bool disk_backup = false;
  std::string tag = "default";
  std::string backend = "pinned";
};

RegionState InitialState() {
  RegionState s;
  s.interesting = EnvOn("TMS_INIT_ENABLE");
  s.cpu_backup = EnvOn("TMS_INIT_ENABLE_CPU_BACKUP");
  if (const char* b = std::getenv("TMS_INIT_CPU_BACKUP_BACKEND"); b != nullptr && *b != '\0') {
    s.backend = b;
  }
  return s;
}

RegionState& State() {
  thread_local RegionState state = InitialState();
  return state;
}

// A vmmshim tag made for a torch_memory_saver tag, and how it pauses.
struct ShimTag {
  std::string tms_tag;
  std::string name;
  bool keep = false;
  bool mmap = false;
  bool disk = false;
  bool operator<(const ShimTag& o) const { return name < o.name; }
};

ShimTag TagOf(const RegionState& s) {
  ShimTag t;
  t.tms_tag = s.tag;
  t.name = "tms:" + s.tag;
  if (s.disk_backup) {
    t.name += ":disk-backup";
    t.keep = t.disk = true;
  } else if (s.cpu_backup) {
    t.name += ":cpu-backup";
    t.keep = true;
    if (s.backend == "mmap") {
      t.name += ":mmap";
      t.mmap = true;
    }
  }
  return t;
}

struct Registry {
  std::mutex mu;
  std::set<ShimTag> tags;
  bool retain = EnvOn("TMS_RETAIN_CPU_BACKUP");
  int last_error = 0;
};

Registry& Tags() {
  static Registry* r = new Registry;  // never destroyed: used until exit
  return *r;
}

// The calling thread's vmmshim tag from its state ("" outside regions: an
// explicit untagged, even where the default tag is a region's).
void Apply() {
  const RegionState& s = State();
  if (!s.interesting) {
    vmmshim_set_allocation_tag("");
    return;
  }
  ShimTag t = TagOf(s);
  {
    Registry& r = Tags();
    std::lock_guard<std::mutex> lock(r.mu);
    r.tags.insert(t);
  }
  vmmshim_set_allocation_tag(t.name.c_str());
}

// TMS_INIT_ENABLE: every thread starts inside "default".
__attribute__((constructor)) void DefaultRegionFromEnvironment() {
  RegionState s = InitialState();
  if (!s.interesting) return;
  ShimTag t = TagOf(s);
  {
    Registry& r = Tags();
    std::lock_guard<std::mutex> lock(r.mu);
    r.tags.insert(t);
  }
  vmmshim_set_default_allocation_tag(t.name.c_str());
}

void Fail(const char* what, const std::string& tag, int code) {
  std::fprintf(stderr, "[vmmshim torch_memory_saver] %s(%s) failed: CUDA error %d\n", what,
               tag.c_str(), code);
  Registry& r = Tags();
  std::lock_guard<std::mutex> lock(r.mu);
  r.last_error = code;
}

}  // namespace

TMS_EXPORT void tms_set_interesting_region(bool v) {
  State().interesting = v;
  Apply();
}
TMS_EXPORT bool tms_get_interesting_region() { return State().interesting; }
TMS_EXPORT void tms_set_enable_cpu_backup(bool v) {
  State().cpu_backup = v;
  Apply();
}
TMS_EXPORT bool tms_get_enable_cpu_backup() { return State().cpu_backup; }
TMS_EXPORT void tms_set_enable_disk_backup(bool v) {
  State().disk_backup = v;
  Apply();
}
TMS_EXPORT bool tms_get_enable_disk_backup() { return State().disk_backup; }
TMS_EXPORT void tms_set_current_tag(const char* tag) {
  State().tag = tag != nullptr ? tag : "default";
  Apply();
}
TMS_EXPORT const char* tms_get_current_tag() { return State().tag.c_str(); }
TMS_EXPORT void tms_set_cpu_backup_backend(const char* backend) {
  State().backend = backend != nullptr ? backend : "pinned";
  Apply();
}
TMS_EXPORT const char* tms_get_cpu_backup_backend() { return State().backend.c_str(); }

TMS_EXPORT void tms_set_retain_cpu_backup(bool v) {
  Registry& r = Tags();
  std::lock_guard<std::mutex> lock(r.mu);
  r.retain = v;
}
TMS_EXPORT bool tms_get_retain_cpu_backup() {
  Registry& r = Tags();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.retain;
}

// 0, or vmmshim_set_backup_directory's code (1: not a writable directory).
TMS_EXPORT int tms_set_disk_backup_dir(const char* path) {
  return vmmshim_set_backup_directory(path);
}

// The CUDA error code of the last failed tms_pause or tms_resume (0: none),
// cleared by the call.
TMS_EXPORT int vmmshim_tms_last_error() {
  Registry& r = Tags();
  std::lock_guard<std::mutex> lock(r.mu);
  return std::exchange(r.last_error, 0);
}

namespace {

// The vmmshim tags made so far for torch_memory_saver tag `tag` (NULL: all),
// and the retain setting, read once for one pause or resume.
std::pair<std::vector<ShimTag>, bool> Selected(const char* tag) {
  Registry& r = Tags();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<ShimTag> selected;
  for (const ShimTag& t : r.tags) {
    if (tag == nullptr || t.tms_tag == tag) selected.push_back(t);
  }
  return {std::move(selected), r.retain};
}

}  // namespace

TMS_EXPORT void tms_pause(const char* tag) {
  const auto [tags, retain] = Selected(tag);
  for (const ShimTag& t : tags) {
    unsigned flags = 0;
    if (t.keep) flags |= VMMSHIM_PAUSE_KEEP_CONTENTS;
    if (t.disk) flags |= VMMSHIM_PAUSE_TO_DISK;
    if (t.keep && !t.disk && !t.mmap && retain) flags |= VMMSHIM_PAUSE_PAGE_LOCKED;
    if (int rc = vmmshim_pause_memory(t.name.c_str(), flags, nullptr); rc != 0) {
      Fail("tms_pause", t.name, rc);
      return;
    }
  }
}

TMS_EXPORT void tms_resume(const char* tag) {
  const auto [tags, retain] = Selected(tag);
  for (const ShimTag& t : tags) {
    // A disk copy is not retained: its file is the backup's whole point.
    const int rc = retain && t.keep && !t.disk
                       ? vmmshim_resume_memory_retaining_contents(t.name.c_str(), nullptr)
                       : vmmshim_resume_memory(t.name.c_str(), nullptr);
    if (rc != 0) {
      Fail("tms_resume", t.name, rc);
      return;
    }
  }
}

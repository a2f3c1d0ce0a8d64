// The exported C API of include/vmmshim/vmmshim.h. Every function answers
// CUDA_ERROR_NOT_SUPPORTED when the shim does not serve allocations (no
// driver, pass-through, a forked child).
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/driver/cu_status.h"
#include "core/base/log.h"
#include "core/heap/host_backup.h"
#include "core/sync/mutex.h"
#include "core/report/residency.h"
#include "core/report/stats_report.h"
#include "interpose/hooks_internal.h"
#include "vmmshim/vmmshim.h"

using vmmshim::GetRuntime;
using vmmshim::Runtime;
using vmmshim::ToCuResult;

namespace {
CUresult ExplicitAccess(const void* ptr, int peer, bool grant) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  return ToCuResult(rt->core->peers().SetPeerAccess(p, peer, grant));
}
}  // namespace

VMMSHIM_EXPORT int vmmshim_grant_peer_access(const void* ptr, int peer_device) {
  return ExplicitAccess(ptr, peer_device, true);
}

VMMSHIM_EXPORT int vmmshim_revoke_peer_access(const void* ptr, int peer_device) {
  return ExplicitAccess(ptr, peer_device, false);
}

VMMSHIM_EXPORT int vmmshim_query_peer_access(const void* ptr, int peer_device,
                                             int* has_access) {
  if (has_access == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  absl::StatusOr<bool> has =
      rt->core->peers().PeerHasAccess(reinterpret_cast<CUdeviceptr>(ptr), peer_device);
  if (!has.ok()) return ToCuResult(has.status());
  *has_access = *has ? 1 : 0;
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_get_paused_contents(const void* ptr, size_t bytes,
                                               const void** host) {
  if (host == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *host = nullptr;
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  absl::StatusOr<const void*> copy =
      rt->core->control().PausedContents(reinterpret_cast<CUdeviceptr>(ptr), bytes);
  if (!copy.ok()) {
    if (vmmshim::IsNotShimMemory(copy.status())) {
      vmmshim::Log().warn("vmmshim_get_paused_contents: {} is not memory the shim serves", ptr);
      return CUDA_ERROR_INVALID_VALUE;
    }
    const CUresult r = ToCuResult(copy.status());
    // Not paused with its contents is an answer, not a mistake.
    if (r != CUDA_ERROR_NOT_FOUND) {
      vmmshim::Log().warn("vmmshim_get_paused_contents: {}", std::string(copy.status().message()));
    }
    return r;
  }
  *host = *copy;
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_set_memory_margin(size_t bytes) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  rt->core->control().SetMemoryMarginBytes(bytes);
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_release_cached_memory(int device, size_t* released_bytes) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  if (device < -1 || device >= vmmshim::kMaxDevices) return CUDA_ERROR_INVALID_DEVICE;
  const size_t released = rt->core->control().Trim(device);
  if (released_bytes != nullptr) *released_bytes = released;
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_set_allocation_tag(const char* tag) {
  if (tag != nullptr && std::strlen(tag) > 255) return CUDA_ERROR_INVALID_VALUE;
  vmmshim::SetAllocationTag(tag);
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_set_default_allocation_tag(const char* tag) {
  if (tag != nullptr && std::strlen(tag) > 255) return CUDA_ERROR_INVALID_VALUE;
  vmmshim::DefaultAllocationTagStorage().store(tag != nullptr ? new std::string(tag) : nullptr,
                                               std::memory_order_release);
  return CUDA_SUCCESS;
}

namespace {

// vmmshim_set_backup_directory's directory ("": none).
struct BackupDirectorySetting {
  vmmshim::Mutex mu;
  std::string path ABSL_GUARDED_BY(mu);
};
BackupDirectorySetting& BackupDirectory() {
  static BackupDirectorySetting* setting = new BackupDirectorySetting;
  return *setting;
}

}  // namespace

VMMSHIM_EXPORT int vmmshim_set_backup_directory(const char* path) {
  if (path != nullptr) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode) || access(path, W_OK | X_OK) != 0) {
      vmmshim::Log().warn("vmmshim_set_backup_directory({}): not a directory this process can "
                          "write to",
                          path);
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  BackupDirectorySetting& setting = BackupDirectory();
  vmmshim::MutexLock lock(&setting.mu);
  setting.path = path != nullptr ? path : "";
  return CUDA_SUCCESS;
}

namespace {

// The pause behind vmmshim_pause_memory and vmmshim_pause_memory_except,
// after their own argument checks.
int Pause(const vmmshim::TagSelection& selection, unsigned flags, size_t* released_bytes) {
  constexpr unsigned kKnown = VMMSHIM_PAUSE_KEEP_CONTENTS | VMMSHIM_PAUSE_PAGE_LOCKED |
                              VMMSHIM_PAUSE_TO_DISK | VMMSHIM_PAUSE_SOLE_SUBMITTER;
  if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  vmmshim::BackupKind kind;
  kind.page_locked = (flags & VMMSHIM_PAUSE_PAGE_LOCKED) != 0;
  if ((flags & VMMSHIM_PAUSE_TO_DISK) != 0) {
    BackupDirectorySetting& setting = BackupDirectory();
    vmmshim::MutexLock lock(&setting.mu);
    kind.directory = setting.path;
    if (kind.directory.empty()) {
      vmmshim::Log().warn("vmmshim_pause_memory: VMMSHIM_PAUSE_TO_DISK without a directory "
                          "(vmmshim_set_backup_directory); nothing paused");
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  absl::StatusOr<size_t> released =
      rt->sleeper->Pause(selection, (flags & VMMSHIM_PAUSE_KEEP_CONTENTS) != 0, kind,
                         (flags & VMMSHIM_PAUSE_SOLE_SUBMITTER) != 0);
  if (!released.ok()) {
    // The quiesce's refusals say what did not finish; the pause's own are
    // logged where they happen.
    if (ToCuResult(released.status()) == CUDA_ERROR_TIMEOUT) {
      vmmshim::Log().warn("vmmshim_pause_memory: {}; nothing paused",
                          std::string(released.status().message()));
    }
    return ToCuResult(released.status());
  }
  if (released_bytes != nullptr) *released_bytes = *released;
  return CUDA_SUCCESS;
}

bool TagTooLong(const char* tag) { return tag != nullptr && std::strlen(tag) > 255; }

// A NUL-terminated document into the caller's buffer (the contract of
// vmmshim_get_statistics and vmmshim_get_residency).
int CopyOut(const std::string& json, char* buffer, size_t size, size_t* needed) {
  if (needed != nullptr) *needed = json.size() + 1;
  if (buffer == nullptr) return CUDA_SUCCESS;
  if (size < json.size() + 1) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(buffer, json.c_str(), json.size() + 1);
  return CUDA_SUCCESS;
}

}  // namespace

VMMSHIM_EXPORT int vmmshim_pause_memory(const char* tag, unsigned flags, size_t* released_bytes) {
  if (released_bytes != nullptr) *released_bytes = 0;
  if (TagTooLong(tag)) return CUDA_ERROR_INVALID_VALUE;
  return Pause(vmmshim::TagSelection::FromNullable(tag), flags, released_bytes);
}

VMMSHIM_EXPORT int vmmshim_pause_memory_except(const char* const* keep_tags, size_t count,
                                               unsigned flags, size_t* released_bytes) {
  if (released_bytes != nullptr) *released_bytes = 0;
  if (keep_tags == nullptr && count > 0) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::string> keep;
  keep.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (keep_tags[i] == nullptr || TagTooLong(keep_tags[i])) return CUDA_ERROR_INVALID_VALUE;
    keep.emplace_back(keep_tags[i]);
  }
  return Pause(vmmshim::TagSelection::AllExcept(std::move(keep)), flags, released_bytes);
}

namespace {

int Resume(const char* tag, bool retain_contents, size_t* restored_bytes) {
  if (restored_bytes != nullptr) *restored_bytes = 0;
  if (TagTooLong(tag)) return CUDA_ERROR_INVALID_VALUE;
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  const vmmshim::TagSelection selection = vmmshim::TagSelection::FromNullable(tag);
  absl::StatusOr<size_t> restored = rt->sleeper->Resume(selection, retain_contents);
  if (!restored.ok()) return ToCuResult(restored.status());
  if (restored_bytes != nullptr) *restored_bytes = *restored;
  return CUDA_SUCCESS;
}

}  // namespace

VMMSHIM_EXPORT int vmmshim_resume_memory(const char* tag, size_t* restored_bytes) {
  return Resume(tag, false, restored_bytes);
}

VMMSHIM_EXPORT int vmmshim_resume_memory_retaining_contents(const char* tag,
                                                            size_t* restored_bytes) {
  return Resume(tag, true, restored_bytes);
}

VMMSHIM_EXPORT int vmmshim_get_statistics(char* buffer, size_t size, size_t* needed) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  return CopyOut(vmmshim::StatsJson(rt->core->control(), getpid()), buffer, size, needed);
}

VMMSHIM_EXPORT int vmmshim_get_residency(char* buffer, size_t size, size_t* needed) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  return CopyOut(vmmshim::ResidencyJson(rt->core->control(), &rt->driver), buffer, size, needed);
}

VMMSHIM_EXPORT int vmmshim_record_memory_history(int enabled, size_t max_entries,
                                                 int stack_frames) {
  if (stack_frames < 0 || stack_frames > vmmshim::MemoryHistory::kMaxStackFrames) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  if (enabled == 0) {
    rt->history->Disable();
  } else {
    rt->history->Enable(max_entries > 0 ? max_entries
                                        : vmmshim::MemoryHistory::kDefaultMaxEntries,
                        stack_frames);
  }
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_write_snapshot(const char* path) {
  if (path == nullptr || *path == '\0') return CUDA_ERROR_INVALID_VALUE;
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  absl::Status written = vmmshim::WriteSnapshot(*rt, path);
  if (!written.ok()) {
    vmmshim::Log().warn("{}", std::string(written.message()));
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  return CUDA_SUCCESS;
}

// The exported C API of include/vmmshim/vmmshim.h. Every function answers
// CUDA_ERROR_NOT_SUPPORTED when the shim does not serve allocations (no
// driver, pass-through, a forked child).
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>

#include "core/driver/cu_status.h"
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
  return ToCuResult(grant ? rt->allocator->SetPeerAccess(p, peer, true) : rt->allocator->SetPeerAccess(p, peer, false));
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
      rt->allocator->PeerHasAccess(reinterpret_cast<CUdeviceptr>(ptr), peer_device);
  if (!has.ok()) return ToCuResult(has.status());
  *has_access = *has ? 1 : 0;
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_release_cached_memory(int device, size_t* released_bytes) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  if (device < -1 || device >= vmmshim::Allocator::kMaxDevices) return CUDA_ERROR_INVALID_DEVICE;
  const size_t released = rt->allocator->Trim(device);
  if (released_bytes != nullptr) *released_bytes = released;
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_set_allocation_tag(const char* tag) {
  if (tag != nullptr && std::strlen(tag) > 255) return CUDA_ERROR_INVALID_VALUE;
  vmmshim::SetAllocationTag(tag != nullptr ? tag : "");
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_pause_memory(const char* tag, unsigned flags, size_t* released_bytes) {
  if (released_bytes != nullptr) *released_bytes = 0;
  if ((flags & ~VMMSHIM_PAUSE_KEEP_CONTENTS) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (tag != nullptr && std::strlen(tag) > 255) return CUDA_ERROR_INVALID_VALUE;
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  absl::StatusOr<size_t> released = rt->allocator->pause().Pause(
      tag != nullptr ? std::optional<std::string>(tag) : std::nullopt,
      (flags & VMMSHIM_PAUSE_KEEP_CONTENTS) != 0);
  if (!released.ok()) return ToCuResult(released.status());
  if (released_bytes != nullptr) *released_bytes = *released;
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_resume_memory(const char* tag, size_t* restored_bytes) {
  if (restored_bytes != nullptr) *restored_bytes = 0;
  if (tag != nullptr && std::strlen(tag) > 255) return CUDA_ERROR_INVALID_VALUE;
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  absl::StatusOr<size_t> restored = rt->allocator->pause().Resume(
      tag != nullptr ? std::optional<std::string>(tag) : std::nullopt);
  if (!restored.ok()) return ToCuResult(restored.status());
  if (restored_bytes != nullptr) *restored_bytes = *restored;
  return CUDA_SUCCESS;
}

VMMSHIM_EXPORT int vmmshim_get_statistics(char* buffer, size_t size, size_t* needed) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || !rt->enabled()) return CUDA_ERROR_NOT_SUPPORTED;
  const std::string json = vmmshim::StatsJson(*rt->allocator, getpid());
  if (needed != nullptr) *needed = json.size() + 1;
  if (buffer == nullptr) return CUDA_SUCCESS;
  if (size < json.size() + 1) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(buffer, json.c_str(), json.size() + 1);
  return CUDA_SUCCESS;
}

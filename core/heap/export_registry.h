// Live exports of shim memory (IPC, docs/ipc.md): which allocation each
// export token names. Kept out of the device heaps so that the heaps hold
// only an `exported` flag per block.
//
// A token is 128 random bits (getrandom), unguessable to other users'
// processes; ExportFd answers only to a live token.
//
// Thread safety: every method may be called from any thread; one mutex,
// a leaf in the lock order (taken after a heap's mutex, never before, and
// nothing is called while it is held).
#ifndef VMMSHIM_CORE_HEAP_EXPORT_REGISTRY_H_
#define VMMSHIM_CORE_HEAP_EXPORT_REGISTRY_H_

#include <cuda.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/sync/mutex.h"

namespace vmmshim {

using ExportToken = std::array<uint8_t, 16>;

class ExportRegistry {
 public:
  // The token of the allocation at `base` on `device`: its existing one, or
  // a new random one. CUDA_ERROR_OPERATING_SYSTEM when getrandom fails.
  absl::StatusOr<ExportToken> Register(int device, CUdeviceptr base) ABSL_LOCKS_EXCLUDED(mu_);
  // The (device, allocation base) a live token names.
  std::optional<std::pair<int, CUdeviceptr>> Lookup(const ExportToken& token) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `token` is still the export of the allocation at `base`.
  bool IsCurrent(const ExportToken& token, int device, CUdeviceptr base) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the exports of allocations in [begin, end) on `device`.
  void DropRange(int device, CUdeviceptr begin, CUdeviceptr end) ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  // fork(): see ShimCore::PrepareFork.
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  static std::string Key(const ExportToken& token) {
    return std::string(token.begin(), token.end());
  }
  mutable Mutex mu_;  // lock order: "export registry mutex" (core/sync/lock_order.h)
  absl::flat_hash_map<std::string, std::pair<int, CUdeviceptr>> by_token_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<int, CUdeviceptr>, ExportToken> by_allocation_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_EXPORT_REGISTRY_H_

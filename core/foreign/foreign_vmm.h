// Other libraries' own VMM memory in this process: the physical handles
// they make with cuMemCreate (directly, or through pointers from
// cuGetProcAddress / cudaGetDriverEntryPoint: PyTorch's expandable segments,
// vLLM's CuMemAllocator, NCCL's buffers) and the handles they import, as the
// hooks observe them. Observation only: every call reaches the driver
// unchanged (docs/pause-resume.md, "What is left"), so that the residency
// report can name that memory instead of leaving it unattributed.
//
// What counts as held: a handle on a device (CUmemAllocationProp's location
// a device; host and host-NUMA handles are not device memory) from its
// cuMemCreate until its last reference is gone: cuMemRelease as many times
// as it was created or retained (cuMemRetainAllocationHandle), and every
// mapping of it unmapped (CUDA Programming Guide 4.16: "the memory is freed
// when all references are released"). The tag is the allocation tag set on
// the thread at cuMemCreate. Imported handles (cuMemImportFromShareableHandle)
// count from their first cuMemMap, with the mapped size, as imported.
//
// Units: bytes. Thread safety: any thread; one mutex, a leaf (core/sync/
// lock_order.h: locks outside the allocator's order), held only around the
// maps, never across a driver call. Process exit: never destroyed.
#ifndef VMMSHIM_CORE_FOREIGN_FOREIGN_VMM_H_
#define VMMSHIM_CORE_FOREIGN_FOREIGN_VMM_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "core/sync/mutex.h"

namespace vmmshim {

// One device's other-library VMM memory now.
struct ForeignDeviceFigures {
  int device = -1;
  std::map<std::string, uint64_t> by_tag;  // held bytes of handles made here, by tag
  uint64_t exported_bytes = 0;             // of them, exported (cuMemExportToShareableHandle)
  uint64_t imported_bytes = 0;             // mapped from handles imported from another process
  uint64_t handles = 0;                    // handles held (made or imported)
  uint64_t bytes() const {
    uint64_t sum = imported_bytes;
    for (const auto& [tag, b] : by_tag) sum += b;
    return sum;
  }
};

class ForeignVmm {
 public:
  // Each records a call that succeeded in the driver.
  void Created(CUmemGenericAllocationHandle handle, size_t size, const CUmemAllocationProp& prop,
               absl::string_view tag) ABSL_LOCKS_EXCLUDED(mu_);
  // `prop`: cuMemGetAllocationPropertiesFromHandle's answer for it (its
  // device), or nullptr when that failed (then not counted).
  void Imported(CUmemGenericAllocationHandle handle, const CUmemAllocationProp* prop)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Retained(CUmemGenericAllocationHandle handle) ABSL_LOCKS_EXCLUDED(mu_);
  void Released(CUmemGenericAllocationHandle handle) ABSL_LOCKS_EXCLUDED(mu_);
  void Exported(CUmemGenericAllocationHandle handle) ABSL_LOCKS_EXCLUDED(mu_);
  void Mapped(CUdeviceptr ptr, size_t size, CUmemGenericAllocationHandle handle)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Unmapped(CUdeviceptr ptr, size_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // Per device with anything held, in device order.
  std::vector<ForeignDeviceFigures> Figures() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Handle {
    size_t size = 0;     // cuMemCreate's; imported: the largest mapping seen
    int device = -1;     // -1: not device memory (not counted)
    std::string tag;
    int references = 1;  // creates/imports + retains - releases
    int mappings = 0;
    bool imported = false;
    bool exported = false;
  };
  struct Mapping {
    size_t size = 0;
    CUmemGenericAllocationHandle handle = 0;
  };
  // Forgets `it` once nothing references it.
  void MaybeForgetLocked(absl::flat_hash_map<CUmemGenericAllocationHandle, Handle>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;  // a leaf (core/sync/lock_order.h)
  absl::flat_hash_map<CUmemGenericAllocationHandle, Handle> handles_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<CUdeviceptr, Mapping> mappings_ ABSL_GUARDED_BY(mu_);  // by mapped address
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_FOREIGN_FOREIGN_VMM_H_

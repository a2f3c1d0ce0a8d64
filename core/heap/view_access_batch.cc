// ViewAccessBatch (core/heap/view_access_batch.h): Note [A run of views gets
// its access once].
#include "core/heap/view_access_batch.h"

#include <algorithm>
#include <utility>

#include "core/driver/cu_status.h"
#include "core/driver/vmm_mapping.h"

namespace vmmshim {

absl::Status ViewAccessBatch::Map(CUdeviceptr va, size_t size,
                                  CUmemGenericAllocationHandle handle, DeviceSet grant,
                                  int owner) {
  if (CUresult r = driver_.cuMemMap(va, size, 0, handle, 0); r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemMap");
  }
  pending_.push_back({va, size, grant | DeviceSet::Of(owner), owner});
  return absl::OkStatus();
}

std::vector<ViewAccessBatch::Refused> ViewAccessBatch::Flush() {
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  std::sort(pending.begin(), pending.end(),
            [](const Pending& a, const Pending& b) { return a.va < b.va; });
  const VmmMapper mapper(driver_);
  std::vector<Refused> refused;
  for (size_t first = 0; first < pending.size();) {
    size_t end = first + 1;  // the run: [first, end)
    while (end < pending.size() &&
           pending[end - 1].va + pending[end - 1].size == pending[end].va &&
           pending[end].grant == pending[first].grant) {
      ++end;
    }
    const CUdeviceptr run_va = pending[first].va;
    const size_t run_size = pending[end - 1].va + pending[end - 1].size - run_va;
    if (!mapper.SetAccess(run_va, run_size, pending[first].grant, DeviceSet()).ok()) {
      for (size_t i = first; i < end; ++i) {
        const Pending& p = pending[i];
        absl::Status s = mapper.SetAccess(p.va, p.size, p.grant, DeviceSet());
        const DeviceSet owner = DeviceSet::Of(p.owner);
        if (!s.ok() && p.grant != owner) s = mapper.SetAccess(p.va, p.size, owner, DeviceSet());
        if (s.ok()) continue;
        refused.push_back({p.va, p.size, mapper.Unmap(p.va, p.size).ok(), std::move(s)});
      }
    }
    first = end;
  }
  return refused;
}

}  // namespace vmmshim

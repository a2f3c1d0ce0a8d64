#include "core/heap/orphaned_memory.h"

namespace vmmshim {

void OrphanedMemory::Retry(const VmmMapper& mapper, VaFreeList& va,
                           ArenaAccounting& accounting) {
  std::vector<Mapping> still_mapped;
  for (const Mapping& m : mappings_) {
    if (!mapper.Unmap(m.base, m.size).ok()) {
      still_mapped.push_back(m);
      continue;
    }
    accounting.Mapped(m.peers, -static_cast<int64_t>(m.size));
    va.Free(m.base, m.size);
    handles_.push_back({m.handle, m.size});
  }
  mappings_ = std::move(still_mapped);
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> left;
  for (const auto& [h, size] : handles_) {
    if (mapper.Release(h).ok()) {
      accounting.Handle(-static_cast<int64_t>(size));
    } else {
      left.push_back({h, size});
    }
  }
  handles_ = std::move(left);
  std::vector<View> views_left;
  for (View& v : views_) {
    if (!v.view.Unmap(mapper, v.base, v.size).ok()) {
      views_left.push_back(std::move(v));
      continue;
    }
    va.Free(v.base, v.size);
  }
  views_ = std::move(views_left);  // the unmapped views' backups go here
}

size_t OrphanedMemory::bytes() const {
  size_t out = 0;
  for (const auto& [handle, size] : handles_) out += size;
  for (const Mapping& m : mappings_) out += m.size;
  return out;
}

}  // namespace vmmshim

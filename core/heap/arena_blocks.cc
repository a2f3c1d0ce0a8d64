#include "core/heap/arena_blocks.h"

namespace vmmshim {

std::pair<CUdeviceptr, Block*> BlockStore::At(CUdeviceptr ptr) const {
  auto it = blocks_.upper_bound(ptr);
  if (it == blocks_.begin()) return {0, nullptr};
  --it;
  if (ptr >= it->first + it->second->size) return {0, nullptr};
  return {it->first, it->second.get()};
}

Block& BlockStore::Add(CUdeviceptr base, size_t size, const Placement& placement, bool packed) {
  auto owned = std::make_unique<Block>();
  Block& block = *owned;
  blocks_[base] = std::move(owned);
  block.size = size;
  block.placement = placement;
  if (packed) {
    block.slab = std::make_unique<Slab>(size);
    Bins& bins = bins_[placement];
    ++bins.packed_blocks;
    bins.packed_bytes += size;
  }
  return block;
}

size_t BlockStore::Erase(CUdeviceptr base) {
  auto it = blocks_.find(base);
  Block& b = *it->second;
  size_t uncached = 0;
  auto bins_it = bins_.find(b.placement);
  if (bins_it != bins_.end()) {
    Bins& bins = bins_it->second;
    bins.open_granules.erase(base);
    if (bins.empty_granules.erase(base) > 0) uncached += b.size;
    if (bins.recent_block == &b) bins.recent_block = nullptr;
    if (b.cached && bins.cached_large.erase({b.size, base}) > 0) uncached += b.size;
    if (b.slab != nullptr) {
      --bins.packed_blocks;
      bins.packed_bytes -= b.size;
    }
    if (bins.open_granules.empty() && bins.empty_granules.empty() &&
        bins.cached_large.empty() && bins.packed_blocks == 0) {
      if (last_bins_ == &bins) last_bins_ = nullptr;
      bins_.erase(bins_it);
    }
  }
  blocks_.erase(it);
  return uncached;
}

Bins* BlockStore::FindBinsSlow(const Placement& placement) {
  auto it = bins_.find(placement);
  if (it == bins_.end()) return nullptr;
  last_placement_ = placement;
  last_bins_ = &it->second;
  return last_bins_;
}

void BlockStore::ClearBins() {
  last_bins_ = nullptr;
  bins_.clear();
}

size_t BlockStore::PackedGranules(const Placement& placement, size_t granularity) const {
  auto it = bins_.find(placement);
  const size_t held = it == bins_.end() ? 0 : it->second.packed_bytes / granularity;
  size_t granules = 1;
  while (granules * 2 <= held / 4 && granules * 2 <= kMaxPackedGranules) granules *= 2;
  return granules;
}

size_t BlockStore::Seal(CUdeviceptr base, Block& block) {
  block.sealed = true;
  auto it = bins_.find(block.placement);
  if (it == bins_.end()) return 0;
  it->second.open_granules.erase(base);
  return it->second.empty_granules.erase(base) > 0 ? block.size : 0;
}

void BlockStore::Withdraw(CUdeviceptr base, const Block& block) {
  auto it = bins_.find(block.placement);
  if (it == bins_.end()) return;
  it->second.open_granules.erase(base);
  if (it->second.recent == base) it->second.recent = 0;
}

void BlockStore::Reopen(CUdeviceptr base, const Block& block) {
  if (block.slab != nullptr && !block.sealed && block.slab->used_bytes() < block.size) {
    bins_[block.placement].open_granules.insert(base);
  }
}

}  // namespace vmmshim

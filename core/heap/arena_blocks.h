// The blocks of one heap arena and their index by placement: which granules
// of a placement have free units, which are empty and cached, which large
// blocks are cached by size, and the granule a hit tried last. The arena
// (core/heap/heap_arena.h) decides what to do with a block; BlockStore keeps
// where it is found.
//
// A placement is what an allocation shares a mapping with: its context (so
// that a free synchronizes the context the memory was allocated in), its
// allowed peers (access rights belong to a whole mapping) and its tag. Open
// granules and cached blocks are kept per placement, so an allocation looks
// only at mappings it may use, and a cached-block lookup is one ordered
// search by size.
//
// Shapes and units: a block is one physical handle mapped at its base, a
// multiple of the granularity in bytes; a packed block (a slab of granules)
// holds small allocations, a large block one.
//
// Thread safety: none of its own; the arena's mutex guards it. Block and
// Bins pointers stay valid while other entries come and go (both are
// node-based), until their own entry is erased.
#ifndef VMMSHIM_CORE_HEAP_ARENA_BLOCKS_H_
#define VMMSHIM_CORE_HEAP_ARENA_BLOCKS_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/node_hash_map.h"
#include "core/base/device_set.h"
#include "core/heap/host_backup.h"
#include "core/heap/host_mapped_pool.h"
#include "core/heap/slab.h"
#include "core/heap/types.h"

namespace vmmshim {

// One physical handle mapped at its base address.
struct Block {
  size_t size = 0;  // mapped bytes, a multiple of the granularity
  CUmemGenericAllocationHandle handle = 0;
  Placement placement;
  size_t requested = 0;         // large blocks: the bytes asked for
  uint16_t origin = 0;          // large blocks: the caller library
  std::unique_ptr<Slab> slab;   // packed granules only
  DeviceSet explicit_grant;     // SetPeerAccess(grant): granted whatever the policy says
  DeviceSet explicit_revoke;    // SetPeerAccess(revoke): denied whatever the policy says
  DeviceSet access;             // devices with read-write access now
  bool sealed = false;          // packed: takes no new allocations
  bool cached = false;          // large: freed, kept mapped for reuse
  bool exportable = false;      // created with the POSIX-fd handle type
  bool exported = false;        // an allocation in it was exported: never cached
  // Paused: its physical memory was released (handle 0, no access) and
  // its VA stays reserved; while a resume is prepared, mapped again
  // (handle set) until ResumeCommit. `backup`: its contents, when kept.
  bool paused = false;
  bool pausing = false;  // PausePrepare marked it (contents copied); live until PauseCommit
  // Freed by the program while pausing: Note [A block freed while its pause
  // is under way] (core/heap/arena_pause.h).
  bool freed_while_pausing = false;
  std::optional<HostBackup> backup;
  ViewMapping view;  // paused: what its address maps
  bool wants_view = false;  // paused by a pause that maps views (a failed resume maps it again)
  // HeapArena::PausedContents gave the program an address in `backup`: it
  // stays where it is (never moved by Note [Views made late]).
  mutable bool contents_handed_out = false;

  size_t allocations() const { return slab != nullptr ? slab->allocations() : 1; }
  bool unmapped() const { return paused && handle == 0; }
  bool has_explicit() const { return !explicit_grant.empty() || !explicit_revoke.empty(); }
  // Freed memory kept mapped: a cached large block or an empty granule.
  bool idle() const { return cached || (slab != nullptr && slab->empty()); }
};

// Open granules and cached memory of one placement.
struct Bins {
  absl::btree_set<CUdeviceptr> open_granules;  // packed, with free units, not sealed
  absl::btree_set<CUdeviceptr> empty_granules; // cached: empty, still mapped
  // (size, base) -> the block, so that a cache hit looks nothing up in the blocks.
  absl::btree_map<std::pair<size_t, CUdeviceptr>, Block*> cached_large;
  // The open granule that last served or took back an allocation, tried
  // first: a free followed by an allocation of the same size (the common
  // case) finds its hole there without trying the granules before it.
  CUdeviceptr recent = 0;
  // The block at `recent` when set with it, so that a hit there looks
  // nothing up in the blocks; null once that block is forgotten.
  Block* recent_block = nullptr;
  int packed_blocks = 0;    // packed blocks of the placement held now (open, full or empty)
  size_t packed_bytes = 0;  // their bytes
};

class BlockStore {
 public:
  using Blocks = absl::btree_map<CUdeviceptr, std::unique_ptr<Block>>;

  BlockStore() = default;
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // The block containing `ptr` and its base, or {0, nullptr}.
  std::pair<CUdeviceptr, Block*> At(CUdeviceptr ptr) const;
  // The block at `base`, which must be held.
  Block& Get(CUdeviceptr base) const { return *blocks_.at(base); }
  bool Contains(CUdeviceptr base) const { return blocks_.contains(base); }
  const Blocks& blocks() const { return blocks_; }
  Blocks& blocks() { return blocks_; }

  // A new block of `size` bytes at `base` with `placement`; a packed one is
  // counted in its placement's packed blocks.
  Block& Add(CUdeviceptr base, size_t size, const Placement& placement, bool packed);
  // Takes the block at `base` out of its placement's bins and erases it.
  // Returns the bytes it held in the cache (an empty granule or a cached
  // large block), for the caller's figures.
  size_t Erase(CUdeviceptr base);

  // The bins of `placement`, or null. Remembers it, so that the next call
  // for the same placement (one placement per program and device is the
  // common case) compares instead of hashing.
  // Inline: the hit path's first step (core/heap/heap_arena.h, fast path).
  Bins* FindBins(const Placement& placement) {
    if (last_bins_ != nullptr && last_placement_ == placement) return last_bins_;
    return FindBinsSlow(placement);
  }
  // The bins of `placement`, made when it has none.
  Bins& BinsOf(const Placement& placement) { return bins_[placement]; }
  const absl::node_hash_map<Placement, Bins>& bins() const { return bins_; }
  void ClearBins();

  // Granules for a new packed block of `placement`: a quarter of the
  // placement's packed bytes held, rounded down to a power of two granules,
  // from 1 to kMaxPackedGranules: few driver calls once many small
  // allocations are held, little mapped and unused (docs/performance.md,
  // "Packed blocks grow by a quarter").
  size_t PackedGranules(const Placement& placement, size_t granularity) const;
  static constexpr int kMaxPackedGranules = 8;

  // Granule `base` takes no new allocations: out of the open and empty
  // granules. Returns the bytes that left the cache.
  size_t Seal(CUdeviceptr base, Block& block);
  // Granule `base` out of the search while it is paused or pausing.
  void Withdraw(CUdeviceptr base, const Block& block);
  // A granule with room that is not sealed takes allocations again.
  void Reopen(CUdeviceptr base, const Block& block);

 private:
  // Boxed so that Block pointers stay valid while the map changes.
  Blocks blocks_;
  // Node-based, so that a Bins stays where it is while others come and go.
  absl::node_hash_map<Placement, Bins> bins_;
  Bins* FindBinsSlow(const Placement& placement);

  Placement last_placement_;
  Bins* last_bins_ = nullptr;  // bins_[last_placement_], or null
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_ARENA_BLOCKS_H_

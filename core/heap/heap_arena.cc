#include "core/heap/heap_arena.h"

#include <algorithm>
#include <iterator>
#include <new>
#include <utility>

#include "core/driver/cu_status.h"
#include "core/base/log.h"
#include "core/base/round_up.h"

namespace vmmshim {

HeapArena::HeapArena(const DriverApi& driver, const VmmMapper& mapper,
                       const PeerPolicy& policy, const PeerEnableTable& peers,
                       const PeerEnableTable& pool_peers, ExportRegistry& exports,
                       ReservationMap& ranges, GlobalCounters& global, DeviceCounters& shared,
                       Options options)
    : driver_(driver),
      mapper_(mapper),
      exports_(exports),
      ranges_(ranges),
      options_(options),
      access_(options.device, policy, peers, pool_peers, options.history),
      create_(options.device, options.prop, options.compression),
      va_(options.granularity),
      acct_(global, shared, options.cache_limit, options.device) {}

HeapArena::~HeapArena() = default;

void HeapArena::AfterForkChild() { new (&mu_) Mutex; }

std::optional<PointerInfo> HeapArena::FindLocked(CUdeviceptr ptr) const {
  const auto [base, block] = blocks_.At(ptr);
  if (block == nullptr || block->cached) return std::nullopt;
  PointerInfo info;
  info.range_base = base;
  info.range_size = block->size;
  info.device = options_.device;
  info.context = block->placement.context;
  info.stream_ordered = block->placement.stream_ordered;
  info.allowed = block->placement.allowed;
  if (!block->placement.tag.empty()) info.tag = block->placement.tag;
  info.has_explicit = block->has_explicit();
  info.paused = block->paused || block->pausing;
  if (block->slab == nullptr) {
    if (ptr >= base + block->requested) return std::nullopt;
    info.allocation_base = base;
    info.allocation_size = block->requested;
  } else {
    std::optional<std::pair<size_t, size_t>> found = block->slab->Find(ptr - base);
    if (!found) return std::nullopt;
    info.allocation_base = base + found->first;
    info.allocation_size = found->second;
    info.packed = true;
  }
  // A deferred free is already gone for the application.
  if (!deferred_.empty() && deferred_.contains(info.allocation_base)) return std::nullopt;
  return info;
}

std::optional<PointerInfo> HeapArena::Find(CUdeviceptr ptr) const {
  MutexLock lock(&mu_);
  return FindLocked(ptr);
}

std::optional<CUdeviceptr> HeapArena::AllocateFast(const Placement& placement, size_t bytes,
                                                   bool cached_only, uint16_t origin) {
  MutexLock lock(&mu_);
  Bins* found = blocks_.FindBins(placement);
  if (found == nullptr) return std::nullopt;
  Bins& bins = *found;
  std::optional<CUdeviceptr> ptr;
  if (bytes > options_.packing_threshold) {
    // The smallest cached block of this placement that fits and wastes at
    // most a quarter of the request.
    const size_t rounded = RoundUp(bytes, options_.granularity);
    auto it = bins.cached_large.lower_bound({rounded, 0});
    if (it == bins.cached_large.end() || it->first.first > LargestReusableBlock(rounded)) {
      return std::nullopt;
    }
    const CUdeviceptr base = it->first.second;
    Block& b = *it->second;
    acct_.Cached(b.placement.stream_ordered, -static_cast<int64_t>(b.size));
    bins.cached_large.erase(it);
    b.cached = false;
    b.requested = bytes;
    b.origin = origin;
    ++acct_.stats().cache_hits;
    ptr = base;
  } else {
    // Another arena's thread takes only an empty granule (cached memory);
    // packing into granules in use stays with this arena's threads.
    const absl::btree_set<CUdeviceptr>& search =
        cached_only ? bins.empty_granules : bins.open_granules;
    auto try_granule = [&](CUdeviceptr base, Block& block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const bool was_empty = block.slab->empty();
      std::optional<size_t> offset = block.slab->Allocate(bytes, origin);
      if (!offset) return false;
      if (was_empty && bins.empty_granules.erase(base) > 0) {
        acct_.Cached(block.placement.stream_ordered, -static_cast<int64_t>(block.size));
      }
      // A full granule leaves the search until a free in it.
      if (block.slab->used_bytes() == block.size) bins.open_granules.erase(base);
      bins.recent = base;
      bins.recent_block = &block;
      ptr = base + *offset;
      return true;
    };
    const CUdeviceptr recent = bins.recent;
    if (!cached_only && recent != 0 && bins.open_granules.contains(recent)) {
      try_granule(recent, bins.recent_block != nullptr ? *bins.recent_block : blocks_.Get(recent));
    }
    for (auto it = search.begin(); !ptr && it != search.end(); ++it) {
      if (*it == recent && !cached_only) continue;  // tried above
      if (try_granule(*it, blocks_.Get(*it))) break;
    }
    if (!ptr) return std::nullopt;
  }
  NoteAllocationLocked(placement, bytes);
  return ptr;
}

absl::StatusOr<CUdeviceptr> HeapArena::AllocateSlow(const Placement& placement, size_t bytes,
                                                     uint16_t origin) {
  MutexLock lock(&mu_);
  const bool packed = bytes <= options_.packing_threshold;
  size_t size = RoundUp(bytes, options_.granularity);
  if (packed) {
    size = options_.granularity * blocks_.PackedGranules(placement, options_.granularity);
  }
  absl::StatusOr<CUdeviceptr> base = CreateBlockLocked(placement, size, packed);
  if (!base.ok() && packed && size > options_.granularity &&
      ToCuResult(base.status()) == CUDA_ERROR_OUT_OF_MEMORY) {
    size = options_.granularity;  // a larger step does not fit: one granule may
    base = CreateBlockLocked(placement, size, packed);
  }
  if (!base.ok()) return base.status();
  if (!packed) ++acct_.stats().cache_misses;  // once per request, whatever the retries
  Block& block = blocks_.Get(*base);
  CUdeviceptr ptr = *base;
  if (packed) {
    ptr += *block.slab->Allocate(bytes, origin);  // a fresh granule always fits
    if (block.slab->used_bytes() < block.size) blocks_.BinsOf(placement).open_granules.insert(*base);
  } else {
    block.requested = bytes;
    block.origin = origin;
  }
  NoteAllocationLocked(placement, bytes);
  return ptr;
}

void HeapArena::NoteAllocationLocked(const Placement& placement, size_t bytes) {
  ++acct_.stats().allocations;
  ++acct_.stats().live_allocations;
  acct_.stats().bytes += bytes;
  acct_.Live(static_cast<int64_t>(bytes));
  access_.NoteDecisions(acct_, placement.allowed, access_.EnabledFor(placement), 1, bytes, placement.tag);
}

absl::Status HeapArena::ReserveMoreLocked(size_t at_least) {
  const size_t size =
      std::max(options_.reservation_bytes, RoundUp(at_least, options_.granularity));
  absl::StatusOr<CUdeviceptr> base = mapper_.Reserve(size, options_.granularity);
  if (!base.ok()) return base.status();
  va_.AddReservation(*base, size);
  ranges_.Add(*base, size, options_.device, options_.arena);
  return absl::OkStatus();
}

absl::StatusOr<CUdeviceptr> HeapArena::CreateBlockLocked(const Placement& placement,
                                                          size_t size, bool packed) {
  // The driver calls (tens of microseconds each) run without the heap lock;
  // the new block joins the heap only when fully mapped. Physical memory
  // first: it is what runs out, and a request the device cannot hold must
  // not leave a VA reservation behind.
  CUmemAllocationProp prop = create_.prop();
  mu_.Unlock();
  absl::StatusOr<CUmemGenericAllocationHandle> handle = mapper_.Create(size, prop);
  mu_.Lock();
  if (!handle.ok() && create_.DropCompressionAfter(prop, handle.status())) {
    prop = create_.prop();
    handle = mapper_.Create(size, prop);
  }
  if (!handle.ok() && ToCuResult(handle.status()) == CUDA_ERROR_OUT_OF_MEMORY &&
      acct_.cached_bytes() > 0) {
    // Cached memory is free memory to the application: give it back first.
    TrimLocked();
    handle = mapper_.Create(size, prop);
  }
  if (!handle.ok()) return handle.status();
  create_.CheckMade(driver_, prop, *handle);
  std::optional<CUdeviceptr> va = va_.Allocate(size);
  if (!va) {
    if (absl::Status s = ReserveMoreLocked(size); !s.ok()) {
      mapper_.Release(*handle).IgnoreError();
      return s;
    }
    va = va_.Allocate(size);
  }
  // The owner and every peer the placement allows now, in one call.
  const DeviceSet self = DeviceSet::Of(options_.device);
  const DeviceSet target = (placement.allowed & access_.EnabledFor(placement)) | self;
  mu_.Unlock();
  VmmMapper::MapStep failed = VmmMapper::MapStep::kNone;
  absl::Status mapped = mapper_.MapWithAccess(*va, size, *handle, target, &failed);
  if (!mapped.ok()) mapper_.Release(*handle).IgnoreError();
  mu_.Lock();
  // cuMemSetAccess ran unless cuMemMap failed.
  if (failed != VmmMapper::MapStep::kMap) ++acct_.stats().set_access_calls;
  if (!mapped.ok()) {
    va_.Free(*va, size);
    return mapped;
  }
  Block& block = blocks_.Add(*va, size, placement, packed);
  block.handle = *handle;
  block.access = target;
  block.exportable = prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  acct_.Mapped(target - self, static_cast<int64_t>(size));
  acct_.Handle(static_cast<int64_t>(size));
  acct_.PoolReserved(block.placement.stream_ordered, static_cast<int64_t>(size));
  RecordSegmentLocked(HistoryAction::kSegmentAlloc, *va, block);
  // A peer enabled or disabled while the lock was released did not see this
  // block: bring it to the current target now.
  if (access_.Target(block) != target) {
    absl::Status applied = ApplyAccessLocked();
    // Only this block's own failure fails the allocation (a failing run of
    // other blocks is theirs; they are retried at the next change).
    Block& now = blocks_.Get(*va);
    if (!applied.ok() && now.access != access_.Target(now)) {
      DiscardBlockLocked(*va);
      return applied;
    }
  }
  return *va;
}

void HeapArena::RecordSegmentLocked(HistoryAction action, CUdeviceptr base, const Block& b) {
  if (options_.history == nullptr || !options_.history->enabled()) return;
  HistoryRecord r;
  r.action = action;
  r.device = options_.device;
  r.addr = base;
  r.size = b.size;
  r.tag = b.placement.tag;
  options_.history->Record(r);
}

void HeapArena::ForgetBlockLocked(CUdeviceptr base, Forget how) {
  Block& b = blocks_.Get(base);
  const bool stream_ordered = b.placement.stream_ordered;
  // A paused block's memory left the device at its pause (segment_unmap).
  if (!b.unmapped()) RecordSegmentLocked(HistoryAction::kSegmentFree, base, b);
  const DeviceSet peers = b.access - DeviceSet::Of(options_.device);
  // A paused block maps no device memory; only a view left mapped keeps its VA.
  if (how == Forget::kStillMapped && b.unmapped() && !b.view.mapped()) {
    how = Forget::kReleased;
  }
  if (how == Forget::kStillMapped && b.unmapped()) {
    // Its host memory stays with the view until the view is unmapped.
    orphans_.AddView(base, b.size, b.view, std::move(b.backup));
    b.backup.reset();
  } else if (how == Forget::kStillMapped) {
    // Kept aside, counted, its VA not reused, until an unmap succeeds.
    orphans_.AddMapping(base, b.size, b.handle, peers);
  } else {
    acct_.Mapped(peers, -static_cast<int64_t>(b.size));
    // A paused block's handle was accounted for when it was released.
    if (how == Forget::kReleased && !b.unmapped()) acct_.Handle(-static_cast<int64_t>(b.size));
  }
  if (b.paused) acct_.Paused(-static_cast<int64_t>(b.size));
  // Out of the pool's reserved bytes (a cached block rejoins them below as
  // it leaves the cache; a paused one left them at its pause).
  if (!b.unmapped()) acct_.PoolReserved(stream_ordered, -static_cast<int64_t>(b.size));
  if (b.slab != nullptr) {
    acct_.stats().live_allocations -= b.slab->allocations();
    acct_.Live(-static_cast<int64_t>(b.slab->requested_bytes()));
  } else if (!b.cached && b.requested > 0) {  // 0: a new block not yet handed out
    --acct_.stats().live_allocations;
    acct_.Live(-static_cast<int64_t>(b.requested));
  }
  if (!deferred_.empty()) {
    for (auto d = deferred_.begin(); d != deferred_.end();) {
      auto next = std::next(d);
      if (d->first >= base && d->first < base + b.size) deferred_.erase(d);
      d = next;
    }
    acct_.SetDeferred(deferred_.size());
  }
  if (b.exported) exports_.DropRange(options_.device, base, base + b.size);
  if (how != Forget::kStillMapped) va_.Free(base, b.size);
  const size_t uncached = blocks_.Erase(base);
  acct_.Cached(stream_ordered, -static_cast<int64_t>(uncached));
}

absl::Status HeapArena::FreeStreamOrdered(CUdeviceptr ptr, CUcontext context) {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info || info->allocation_base != ptr || !info->stream_ordered || info->context != context) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "stream-ordered release");
  }
  absl::Status status;
  FreeLocked(ptr, info->range_base, blocks_.Get(info->range_base), info->allocation_size,
             /*driver_gone=*/false, &status);
  return status;
}

bool HeapArena::Resize(CUdeviceptr ptr, size_t bytes) {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info || info->allocation_base != ptr || bytes == 0) return false;
  Block& block = blocks_.Get(info->range_base);
  if (info->packed) {
    if (!block.slab->Resize(ptr - info->range_base, bytes)) return false;
  } else {
    if (bytes > block.size || bytes <= options_.packing_threshold) return false;
    block.requested = bytes;
  }
  acct_.Live(static_cast<int64_t>(bytes) - static_cast<int64_t>(info->allocation_size));
  return true;
}

absl::Status HeapArena::Free(CUdeviceptr ptr, bool driver_gone) {
  MutexLock lock(&mu_);
  // FindLocked's checks for a pointer that must start a live allocation,
  // with one lookup of its block and no PointerInfo (a tag copy) built.
  const auto [base, block] = blocks_.At(ptr);
  size_t bytes = 0;  // stays 0 unless `ptr` starts a live allocation
  if (block != nullptr && !block->cached) {
    if (block->slab == nullptr) {
      if (ptr == base) bytes = block->requested;  // 0: a new block not yet handed out
    } else if (std::optional<std::pair<size_t, size_t>> found = block->slab->Find(ptr - base);
               found && found->first == ptr - base) {
      bytes = found->second;
    }
  }
  if (bytes == 0 || (!deferred_.empty() && deferred_.contains(ptr))) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFree");  // interior, or freed meanwhile
  }
  absl::Status status;
  FreeLocked(ptr, base, *block, bytes, driver_gone, &status);
  return status;
}

void HeapArena::FreeLocked(CUdeviceptr ptr, CUdeviceptr base, Block& block, size_t bytes,
                           bool driver_gone, absl::Status* status) {
  const bool packed = block.slab != nullptr;
  // A large block's export goes with the block (ForgetBlockLocked), so that
  // a free that cannot unmap keeps it; a packed free always succeeds.
  if (block.exported && packed) exports_.DropRange(options_.device, ptr, ptr + 1);
  if (!packed) {
    if (driver_gone) {
      ForgetBlockLocked(base, Forget::kReleased);  // the driver has freed everything already
      ++acct_.stats().frees;
      return;
    }
    if (block.pausing) {
      // Note [A block freed while its pause is under way] (core/heap/arena_pause.h).
      --acct_.stats().live_allocations;
      acct_.Live(-static_cast<int64_t>(block.requested));
      block.requested = 0;  // unknown to Find from now on
      block.freed_while_pausing = true;
      ++acct_.stats().frees;
      return;
    }
    if (!block.has_explicit() && !block.exported && !block.paused && !block.pausing &&
        acct_.ReserveCache(block.size)) {
      // Keep it mapped, with its access set, for the next request that fits.
      --acct_.stats().live_allocations;
      acct_.Live(-static_cast<int64_t>(block.requested));
      block.cached = true;
      block.requested = 0;
      block.backup.reset();  // a copy kept across a resume goes with its allocation
      blocks_.BinsOf(block.placement).cached_large.emplace(std::make_pair(block.size, base), &block);
      acct_.Cached(block.placement.stream_ordered, static_cast<int64_t>(block.size));
    } else if (absl::Status s = DestroyBlockLocked(base); !s.ok()) {
      *status = s;
      if (blocks_.Contains(base)) return;  // still mapped: the free failed
    }
    ++acct_.stats().frees;
    return;
  }
  block.slab->Free(ptr - base);
  --acct_.stats().live_allocations;
  acct_.Live(-static_cast<int64_t>(bytes));
  ++acct_.stats().frees;
  // A paused granule takes no allocations (its memory is released) and
  // goes when it empties, as a sealed one does.
  if (block.sealed || block.paused || block.pausing) {
    if (block.pausing && block.slab->empty()) {
      block.freed_while_pausing = true;  // Note [A block freed while its pause is under way]
    } else if (block.slab->empty() && !driver_gone) {
      if (absl::Status s = DestroyBlockLocked(base); !s.ok()) {
        Log().warn("keeping an empty granule on device {}: {}", options_.device, s.ToString());
      }
    }
    return;
  }
  Bins& bins = blocks_.BinsOf(block.placement);
  bins.open_granules.insert(base);
  bins.recent = base;
  bins.recent_block = &block;
  if (!block.slab->empty() || driver_gone) return;
  if (!block.has_explicit() && acct_.ReserveCache(block.size)) {
    block.backup.reset();
    bins.empty_granules.insert(base);
    acct_.Cached(block.placement.stream_ordered, static_cast<int64_t>(block.size));
  } else if (absl::Status s = DestroyBlockLocked(base); !s.ok()) {
    // The application's free succeeded; an empty granule that could not be
    // released stays mapped and serves later requests.
    Log().warn("keeping an empty granule on device {}: {}", options_.device, s.ToString());
  }
}

}  // namespace vmmshim

// HeapArena (core/heap/heap_arena.h): blocks going back to the driver (the
// unmap and release every path shares), and memory leaving the arena other
// than by a free: deferred frees completing, trims of the cache and of
// orphaned handles, context releases, the release of everything.
#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/driver/cu_status.h"
#include "core/heap/heap_arena.h"

namespace vmmshim {

absl::Status HeapArena::DeferFree(CUdeviceptr ptr) {
  MutexLock lock(&mu_);
  std::optional<PointerInfo> info = FindLocked(ptr);
  if (!info || info->allocation_base != ptr) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFree");
  }
  deferred_[ptr] = info->context;
  acct_.SetDeferred(deferred_.size());
  return absl::OkStatus();
}

std::vector<CUcontext> HeapArena::DeferredContexts() const {
  MutexLock lock(&mu_);
  std::vector<CUcontext> out;
  for (const auto& [ptr, context] : deferred_) {
    if (std::find(out.begin(), out.end(), context) == out.end()) out.push_back(context);
  }
  return out;
}

void HeapArena::CompleteDeferred(CUcontext context) {
  MutexLock lock(&mu_);
  std::vector<CUdeviceptr> ready;
  for (const auto& [ptr, ctx] : deferred_) {
    if (ctx == context) ready.push_back(ptr);
  }
  for (CUdeviceptr ptr : ready) {
    deferred_.erase(ptr);
    std::optional<PointerInfo> info = FindLocked(ptr);
    if (!info || info->allocation_base != ptr) continue;  // released with its context
    absl::Status status;
    FreeLocked(ptr, info->range_base, blocks_.Get(info->range_base), info->allocation_size,
               /*driver_gone=*/false, &status);
    if (!status.ok()) Log().warn("completing a deferred free: {}", status.ToString());
  }
  acct_.SetDeferred(deferred_.size());
}

void HeapArena::DiscardBlockLocked(CUdeviceptr base) {
  if (absl::Status s = DestroyBlockLocked(base); !s.ok()) {
    Log().warn("device {}: unmapping {:#x}: {}; retried by Trim", options_.device, base,
               s.ToString());
    if (blocks_.Contains(base)) ForgetBlockLocked(base, Forget::kStillMapped);
  }
}

absl::Status HeapArena::DestroyBlockLocked(CUdeviceptr base) {
  Block& b = blocks_.Get(base);
  if (b.unmapped()) {  // paused: no handle; its view and the VA go back
    if (absl::Status s = UnmapPausedViewLocked(base, b); !s.ok()) return s;
    ForgetBlockLocked(base, Forget::kReleased);
    return absl::OkStatus();
  }
  if (absl::Status s = mapper_.Unmap(base, b.size); !s.ok()) return s;
  // The mapping is gone, so the VA is free again, whatever cuMemRelease
  // says. A handle the driver would not release stays counted and is retried
  // by Trim and ReleaseAll; the block itself is gone (the free succeeded).
  const CUmemGenericAllocationHandle handle = b.handle;
  const size_t size = b.size;
  absl::Status released = mapper_.Release(handle);
  if (!released.ok()) {
    Log().warn("device {}: {}; retried by Trim", options_.device, released.ToString());
    orphans_.AddHandle(handle, size);
  }
  ForgetBlockLocked(base, released.ok() ? Forget::kReleased : Forget::kHandleHeld);
  return absl::OkStatus();
}

void HeapArena::TrimLocked() {
  orphans_.Retry(mapper_, va_, acct_);
  std::vector<CUdeviceptr> bases;
  for (const auto& [placement, bins] : blocks_.bins()) {
    for (const auto& [key, block] : bins.cached_large) bases.push_back(key.second);
    for (CUdeviceptr base : bins.empty_granules) bases.push_back(base);
  }
  // Sealed granules that emptied but could not be unmapped then; not one
  // whose pause is under way (Note [A block freed while its pause is under
  // way], core/heap/arena_pause.h: its copy may be reading it).
  for (const auto& [base, block] : blocks_.blocks()) {
    if (block->slab != nullptr && block->sealed && block->slab->empty() && !block->pausing) {
      bases.push_back(base);
    }
  }
  for (CUdeviceptr base : bases) {
    if (absl::Status s = DestroyBlockLocked(base); !s.ok()) {
      // At exit the driver may be gone already: nothing left to release.
      if (ToCuResult(s) == CUDA_ERROR_DEINITIALIZED) return;
      Log().warn("device {}: releasing cached memory: {}", options_.device, s.ToString());
    }
  }
}

size_t HeapArena::Trim() {
  MutexLock lock(&mu_);
  const size_t before = acct_.cached_bytes();
  TrimLocked();
  return before - acct_.cached_bytes();
}

bool HeapArena::Holds(CUcontext context) const {
  MutexLock lock(&mu_);
  for (const auto& [base, block] : blocks_.blocks()) {
    if (block->placement.context == context) return true;
  }
  return false;
}

size_t HeapArena::ReleaseContext(CUcontext context) {
  MutexLock lock(&mu_);
  std::vector<CUdeviceptr> bases;
  for (const auto& [base, block] : blocks_.blocks()) {
    if (block->placement.context == context) bases.push_back(base);
  }
  if (bases.empty()) return 0;
  size_t released = 0;
  for (CUdeviceptr base : bases) {
    // A paused block holds no physical memory: nothing of it is released.
    const size_t size = blocks_.Get(base).unmapped() ? 0 : blocks_.Get(base).size;
    if (absl::Status s = DestroyBlockLocked(base); !s.ok()) {
      Log().warn("device {}: releasing memory of a destroyed context: {}", options_.device,
                 s.ToString());
      // Still mapped: never served again, unmapped by a later Trim.
      ForgetBlockLocked(base, Forget::kStillMapped);
      continue;
    }
    released += size;
  }
  return released;
}

void HeapArena::UnmapPausedLocked(CUdeviceptr base) {
  Block& b = blocks_.Get(base);
  if (absl::Status s = mapper_.Unmap(base, b.size); !s.ok()) {
    Log().warn("vmmshim_resume_memory: unmapping {:#x} after a failed resume: {}; kept mapped "
               "for the next resume",
               base, s.ToString());
    return;
  }
  acct_.Mapped(b.access - DeviceSet::Of(options_.device), -static_cast<int64_t>(b.size));
  acct_.PoolReserved(b.placement.stream_ordered, -static_cast<int64_t>(b.size));
  if (absl::Status s = mapper_.Release(b.handle); !s.ok()) {
    Log().warn("device {}: {}; retried by Trim", options_.device, s.ToString());
    orphans_.AddHandle(b.handle, b.size);  // still counted
  } else {
    acct_.Handle(-static_cast<int64_t>(b.size));
  }
  b.handle = 0;
  b.access = DeviceSet();
}

absl::Status HeapArena::UnmapPausedViewLocked(CUdeviceptr base, Block& b) {
  absl::Status s = b.view.Unmap(mapper_, base, b.size);
  if (!s.ok()) {
    Log().warn("device {}: unmapping the host memory at paused {:#x} ({} bytes): {}",
               options_.device, base, b.size, s.ToString());
  }
  return s;
}

absl::Status HeapArena::ReleaseAll() {
  MutexLock lock(&mu_);
  absl::Status first;
  std::vector<CUdeviceptr> bases;
  for (const auto& entry : blocks_.blocks()) bases.push_back(entry.first);
  for (CUdeviceptr base : bases) {
    absl::Status s = DestroyBlockLocked(base);
    if (blocks_.Contains(base)) ForgetBlockLocked(base, Forget::kStillMapped);
    first.Update(s);
  }
  orphans_.Retry(mapper_, va_, acct_);
  if (!orphans_.empty()) {
    orphans_.AbandonViews();  // the host memory pools go before the arena
    first.Update(DriverError(CUDA_ERROR_UNKNOWN, "releasing handles that stayed mapped"));
  }
  for (const auto& [base, size] : va_.reservations()) {
    first.Update(mapper_.FreeReservation(base, size));
    ranges_.Remove(base);
  }
  va_ = VaFreeList(options_.granularity);
  blocks_.ClearBins();
  deferred_.clear();
  acct_.Cached(/*stream_ordered=*/false, -static_cast<int64_t>(acct_.cached_bytes()));
  acct_.SetDeferred(deferred_.size());
  return first;
}

}  // namespace vmmshim

// ArenaPause (core/heap/arena_pause.h): what a paused block's address maps
// meanwhile, its view (core/heap/host_mapped_pool.h), at the pause, again
// after a failed resume, and late (Note [Views made late], core/heap/pause.h);
// the pause and resume themselves are in arena_pause.cc.
#include <atomic>
#include <utility>
#include <vector>

#include "core/base/log.h"
#include "core/heap/arena_pause.h"
#include "core/heap/heap_arena.h"

namespace vmmshim {
namespace {

// Paused with a view wanted but none mapped, its contents kept in host
// memory that is not host VMM memory, which may be moved (the program holds
// no address in it): Note [Views made late].
bool WantsLateView(const Block& b) {
  return b.paused && b.wants_view && b.handle == 0 && !b.view.mapped() &&
         !b.contents_handed_out && b.backup.has_value() && b.backup->host_mapped() == nullptr &&
         !b.backup->in_file();
}

}  // namespace

void ArenaPause::MapViewLocked(CUdeviceptr base, Block& b, DeviceSet access,
                               HostMappedPools& views) {
  if (b.view.mapped()) return;  // mapped already (a view the resume kept)
  const int device = arena_.options_.device;
  const HostMappedMemory* contents = b.backup.has_value() ? b.backup->host_mapped() : nullptr;
  if (b.backup.has_value() && contents == nullptr) return;  // kept elsewhere: faults
  HostMappedPool* pool = views.For(device);
  if (pool == nullptr) return;  // no host VMM memory here
  absl::StatusOr<ViewMapping> view = pool->MapView(base, b.size, contents, access);
  if (!view.ok()) {
    Log().warn("device {}: paused memory at {:#x} ({} bytes) is not addressable: {}; an access "
               "to it faults",
               device, base, b.size, view.status().ToString());
    return;
  }
  b.view = *view;
}

size_t ArenaPause::MapLateViews(HostMappedPools& views, const std::atomic<int>& waiting) {
  std::vector<CUdeviceptr> late;
  {
    MutexLock lock(&arena_.mu_);
    for (const auto& [base, b] : arena_.blocks_.blocks()) {
      if (WantsLateView(*b)) late.push_back(base);
    }
  }
  HostMappedPool* pool = late.empty() ? nullptr : views.For(arena_.options_.device);
  if (pool == nullptr) return 0;
  size_t bytes = 0;
  for (CUdeviceptr base : late) {
    MutexLock lock(&arena_.mu_);
    // Looked up again: a free or a resume may have come between the blocks.
    if (!arena_.blocks_.Contains(base)) continue;
    Block& b = arena_.blocks_.Get(base);
    if (!WantsLateView(b)) continue;
    const LateMove moved = MoveIntoMadeHostMemory(*pool, &b.backup, b.size, waiting);
    if (moved == LateMove::kStopped) break;  // a pause or resume first
    if (moved == LateMove::kNoneMade) continue;  // it stays as it is
    MapViewAgainLocked(base, b, &views);
    if (b.view.mapped()) bytes += b.size;
  }
  return bytes;
}

void ArenaPause::MapViewAgainLocked(CUdeviceptr base, Block& b, HostMappedPools* views) {
  // Fault mode, a block paused without a view (a deep sleep's), or device
  // memory still mapped.
  if (views == nullptr || !b.wants_view || b.handle != 0) return;
  MapViewLocked(base, b, arena_.access_.Target(b) | DeviceSet::Of(arena_.options_.device),
                *views);
}

}  // namespace vmmshim

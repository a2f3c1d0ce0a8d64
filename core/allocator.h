// The VMM allocator: device memory from cuMemCreate physical handles mapped
// into reserved virtual address ranges (CUDA Programming Guide section 4.16,
// "Virtual Memory Management").
//
// Shapes and units. Sizes are bytes. Each device's allocation granularity
// (cuMemGetAllocationGranularity, RECOMMENDED; 2 MiB on H200) is the unit of
// physical memory and of VA:
//   - a request of more than `packing_threshold` bytes (default: half a
//     granule) gets its own physical handle of the request rounded up to the
//     granularity, mapped at a granularity-aligned address: one handle per
//     large allocation;
//   - smaller requests are packed into shared granules (one handle each) in
//     256-byte units, so every pointer is 256-byte aligned, as cudaMalloc
//     guarantees. Granules are per (device, context), so that a free can
//     synchronize the context the memory was allocated in.
// VA comes from per-device reservations of `reservation_bytes` (default:
// twice the device's memory), reserved when first needed and grown by
// another reservation when exhausted; reservations are kept until
// ReleaseAll().
//
// Address ranges. Find() reports for every pointer the range of the physical
// handle that backs it, which is what the driver itself reports for VMM
// memory (cuMemGetAddressRange on a VMM pointer gives the mapped handle) and
// what NCCL's user-buffer registration relies on (retain the handle at the
// range base, map the range size from offset 0). For a large allocation that
// is the allocation rounded up to the granularity; for a packed allocation it
// is its granule.
//
// Caching. A freed large block stays mapped, with its access set, and serves
// the next request of the same (context, allowed peers, tag) whose rounded
// size it fits within a quarter, with no driver call; empty granules stay
// mapped too. The cache of each device is bounded (cache_limit_*); cached
// bytes count as free in IdleBytes (cuMemGetInfo); when cuMemCreate reports
// CUDA_ERROR_OUT_OF_MEMORY the device's cache is released and the call
// retried once; Trim() releases it on request. VA is never returned to the
// driver before ReleaseAll, so reservations are cached as well.
//
// Synchronization. cuMemFree waits for outstanding work of the device before
// the memory can be reused; cuMemUnmap/cuMemRelease do not. Free() therefore
// synchronizes the context that was current at allocation before the memory
// is unmapped or handed out again.
//
// Errors. Driver failures come back as absl::Status carrying the exact
// CUresult (core/cu_status.h). Every multi-step create -> map -> set-access
// sequence undoes its completed steps on failure, so an error leaves no
// handle, mapping or VA behind, and a later request can succeed.
//
// Peer access (docs/peer-access.md). Each allocation carries the set of
// devices its PeerPolicy allows (decided once, at allocation, from owner,
// size and tag). A peer that enabled access to the owner (EnablePeer, where
// cuCtxEnablePeerAccess arrives) gets a cuMemSetAccess grant on exactly the
// allowed allocations, existing and future; DisablePeer revokes them.
// Access rights belong to a mapping, so packed allocations share granules
// only with allocations of the same (context, allowed set, tag): granting a
// granule never exposes an allocation whose policy denies that peer.
// Changes are batched: one cuMemSetAccess per contiguous run of mappings that
// change the same way, with every changed device in one descriptor array.
// Explicit grants and revokes (GrantPeer/RevokePeer) override the policy for
// one allocation; on a packed allocation they act on its whole granule and
// are refused (CUDA_ERROR_NOT_PERMITTED) when that would change the access of
// another live allocation that is neither in the same state nor tagged (the
// rule is spelled out at GrantPeer).
//
// Thread safety: all methods may be called concurrently, except ReleaseAll
// and destruction, which must not overlap other calls. Each device has its
// own mutex; it is not held across the cuMemCreate/cuMemMap/cuMemSetAccess
// of a new block, so a slow-path allocation does not stall cache hits on the
// same device (it is held across the rarer unmap of a block the cache cannot
// keep, VA reservation, and cache release on OOM). Pointer lookups take a
// shared lock on the reservation map.
//
// Process exit: the shim never destroys its Allocator. When the driver is
// already torn down (CUDA_ERROR_DEINITIALIZED, seen when cudart frees at
// exit), Free() forgets the allocation without further driver calls and
// returns that code, as the driver itself would.
#ifndef VMMSHIM_CORE_ALLOCATOR_H_
#define VMMSHIM_CORE_ALLOCATOR_H_

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "core/driver_api.h"
#include "core/peer_policy.h"
#include "core/slab.h"
#include "core/va_arena.h"

namespace vmmshim {

struct AllocatorOptions {
  // Requests of at most this many bytes are packed into shared granules.
  // 0 means half the device's granularity.
  size_t packing_threshold = 0;
  // Bytes per VA reservation; 0 means twice the device's total memory. Always
  // rounded up to the granularity; a larger request gets a reservation of its
  // own size.
  size_t reservation_bytes = 0;
  // Pitch alignment of AllocatePitch, in bytes (a power of two).
  size_t pitch_alignment = 512;
  // Which peers may map which allocations.
  PeerPolicy peer_policy;
  // The most each device keeps mapped for reuse after frees (freed large
  // blocks and empty granules): a percentage of the device's memory when
  // cache_limit_percent >= 0, else cache_limit_bytes.
  double cache_limit_percent = 10;
  size_t cache_limit_bytes = 0;
  // Physical memory is created with the POSIX file-descriptor handle type
  // where the device supports it (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_
  // DESCRIPTOR_SUPPORTED), so that Export can share it with other processes
  // (guide section 4.16.3). false: no handle type, nothing exportable.
  bool exportable = true;
  // Request generic compression (guide section 4.16.5.2) where the device
  // reports CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED; the first
  // handle is checked with cuMemGetAllocationPropertiesFromHandle and, when
  // the driver did not grant compression, later ones are made without it.
  bool compression = false;
};

// What became of a compression request on one device.
enum class CompressionState { kOff, kUnsupported, kGranted, kNotGranted };

// Per-device statistics (DeviceStats) and per-peer counters.
struct PeerCounters {
  uint64_t grants = 0;   // allocations granted to this peer (by policy or explicitly)
  uint64_t denials = 0;  // allocations denied to this peer while it had access enabled
  uint64_t mapped_bytes = 0;       // bytes of this device's memory mapped into the peer now
  uint64_t peak_mapped_bytes = 0;  // the most mapped into it at any time
};

struct DeviceStats {
  int device = -1;
  uint64_t allocations = 0;  // served from VMM
  uint64_t bytes = 0;        // their requested bytes
  uint64_t live_bytes = 0;
  uint64_t peak_live_bytes = 0;
  uint64_t handle_bytes = 0;  // physical memory held
  uint64_t peak_handle_bytes = 0;
  uint64_t set_access_calls = 0;
  uint64_t cache_hits = 0;    // large requests served from the cache
  uint64_t cache_misses = 0;  // large requests that made a new handle
  uint64_t cached_bytes = 0;  // mapped for reuse now
  uint64_t exports = 0;       // allocations exported (Export)
  uint64_t context_releases = 0;  // ReleaseContext calls that released memory here
  CompressionState compression = CompressionState::kOff;
  std::array<PeerCounters, 64> peers{};  // indexed by peer device
};

struct AllocatorStats {
  uint64_t served_allocations = 0;       // allocations served from VMM
  uint64_t served_bytes = 0;             // their requested bytes
  uint64_t passthrough_allocations = 0;  // requests handed to the driver
  uint64_t passthrough_bytes = 0;
  uint64_t frees = 0;
  uint64_t live_allocations = 0;
  uint64_t live_bytes = 0;               // requested bytes of live allocations
  uint64_t handles = 0;                  // live physical handles
  uint64_t handle_bytes = 0;             // their bytes (device memory in use)
  uint64_t peak_handle_bytes = 0;
};

// What Find() knows about a pointer inside shim memory.
struct PointerInfo {
  CUdeviceptr allocation_base = 0;  // the pointer Allocate returned
  size_t allocation_size = 0;       // the bytes requested
  CUdeviceptr range_base = 0;       // the backing handle's mapping
  size_t range_size = 0;
  int device = -1;
  CUcontext context = nullptr;      // current when allocated
  bool packed = false;
};

// One read-write access descriptor (cuMemSetAccess) per device set in the
// bit mask `devices` (bit d = device d).
std::vector<CUmemAccessDesc> ReadWriteAccess(uint64_t devices);

// An allocation made shareable by Export.
struct ExportedAllocation {
  // 128 random bits naming this export; ExportFd answers only to it.
  std::array<uint8_t, 16> token{};
  uint64_t offset = 0;       // of the allocation inside its physical handle
  uint64_t size = 0;         // the allocation's requested bytes
  uint64_t handle_size = 0;  // the physical handle's bytes (what an importer maps)
  int device = -1;
};

class Allocator {
 public:
  static constexpr int kMaxDevices = 64;

  // `driver` must outlive the allocator.
  explicit Allocator(const DriverApi& driver, AllocatorOptions options = {});
  // Releases everything still held (see ReleaseAll).
  ~Allocator();

  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  struct Allocation {
    CUdeviceptr ptr = 0;
    // false: not served, and nothing was done; the caller hands the request
    // to the driver. That happens when no context is current (the driver
    // then returns its own error) and on devices without VMM support.
    bool served = false;
  };

  // `bytes` > 0, on the device of the current context. `tag` ("" = none)
  // is matched by rules policies and groups packed allocations.
  absl::StatusOr<Allocation> Allocate(size_t bytes, absl::string_view tag = "");

  // A pitched 2D allocation: pitch = width rounded up to pitch_alignment,
  // bytes = pitch * height. `width` and `height` > 0. *pitch is set whenever
  // the pitch could be computed, also when the allocation then fails, as the
  // driver does.
  absl::StatusOr<Allocation> AllocatePitch(size_t width, size_t height, size_t* pitch,
                                           absl::string_view tag = "");

  // Frees an allocation made by Allocate. Returns false when `ptr` is not in
  // shim memory (the caller hands it to the driver). A pointer inside shim
  // memory that is not the start of a live allocation (interior pointer,
  // double free) gets CUDA_ERROR_INVALID_VALUE, as the driver gives for a
  // pointer it did not allocate.
  absl::StatusOr<bool> Free(CUdeviceptr ptr);

  // The live allocation containing `ptr`, or nullopt.
  std::optional<PointerInfo> Find(CUdeviceptr ptr) const;

  // True when `ptr` lies in VA reserved by the shim (live or not).
  bool Owns(CUdeviceptr ptr) const;

  // Bytes the shim holds mapped on `device` that serve no allocation (its
  // cache); these count as free memory.
  size_t IdleBytes(int device) const;

  // Releases the cache of `device` (-1: every device) to the driver; returns
  // the bytes released. Allocation also does this by itself, once, before
  // reporting CUDA_ERROR_OUT_OF_MEMORY.
  size_t Trim(int device = -1);

  // Makes the live allocation containing `ptr` shareable with other
  // processes: returns a token that ExportFd accepts until the allocation is
  // freed. Exporting the same allocation again returns the same token.
  // Exported memory is never cached for reuse: a freed exported block is
  // unmapped and released at once (the driver keeps the physical memory
  // alive while an importer still maps it), and a packed granule holding an
  // exported allocation takes no new allocations. The importer can map the
  // whole physical handle, which for a packed allocation is its granule
  // (other allocations of the same context, policy and tag).
  // Errors: CUDA_ERROR_INVALID_VALUE when `ptr` is not in a live shim
  // allocation, or its memory was created without the POSIX-fd handle type
  // (exportable = false, or unsupported by the device).
  absl::StatusOr<ExportedAllocation> Export(CUdeviceptr ptr);

  // A new POSIX file descriptor for the physical handle behind the export
  // named by `token`, when `offset` and `size` match it (the caller owns and
  // closes the descriptor); *handle_size is set to the handle's bytes.
  // CUDA_ERROR_INVALID_VALUE when no live export has this token (never
  // exported, freed, or forged) or offset/size differ; otherwise the
  // driver's cuMemExportToShareableHandle error.
  absl::StatusOr<int> ExportFd(const std::array<uint8_t, 16>& token, uint64_t offset,
                               uint64_t size, uint64_t* handle_size);

  // The devices that should access `bytes` of memory used on `device` that
  // the shim maps but did not allocate (IPC imports): `device` itself and
  // the peers that enabled access to it and that the policy allows for an
  // untagged allocation of this size.
  uint64_t AccessTargets(int device, size_t bytes);

  // Releases everything allocated in `context` (live allocations, their
  // cache, their exports), after synchronizing it: what the driver does to a
  // context's cuMemAlloc memory when the context is destroyed or reset
  // (cuCtxDestroy, cuDevicePrimaryCtxReset, the last
  // cuDevicePrimaryCtxRelease). VA reservations stay for reuse. Returns the
  // physical bytes released. Pointers into the released memory become
  // unknown (Free gives CUDA_ERROR_INVALID_VALUE, as the driver does).
  // `synchronize` false: the context is already gone (its destruction waited
  // for its work). Makes no driver call when nothing of `context` is held.
  size_t ReleaseContext(CUcontext context, bool synchronize);

  // fork(): PrepareFork takes every lock of the allocator, in lock order, so
  // that no other thread holds one at the fork; AfterForkParent releases
  // them; AfterForkChild gives the child (a single thread) fresh, unlocked
  // mutexes, since unlocking one that the parent's other threads queued on
  // would wait for threads the child does not have. For pthread_atfork.
  void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // `context` was destroyed or reset (cuCtxDestroy, cuDevicePrimaryCtxReset):
  // forgets which device it belonged to, on every thread, so that a new
  // context that reuses the handle is asked about again.
  void ForgetContext(CUcontext context);

  // Records a request the caller handed to the driver (for statistics).
  void NotePassThrough(size_t bytes);

  // `peer_device` has enabled peer access to `owner_device`'s memory (after
  // the driver accepted cuCtxEnablePeerAccess, or instead of it). Grants the
  // policy-allowed allocations of the owner, existing and future. Calls nest:
  // each EnablePeer needs one DisablePeer.
  absl::Status EnablePeer(int peer_device, int owner_device);
  // Undoes one EnablePeer; the last one revokes the policy grants (explicit
  // grants stay).
  absl::Status DisablePeer(int peer_device, int owner_device);

  // Explicit per-allocation control, combined with any policy: `peer` may
  // (GrantPeer) or may not (RevokePeer) map the allocation containing `ptr`,
  // whether or not it enabled peer access. Errors: CUDA_ERROR_INVALID_VALUE
  // (not shim memory), CUDA_ERROR_INVALID_DEVICE (bad ordinal),
  // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (cuDeviceCanAccessPeer says no),
  // CUDA_ERROR_NOT_PERMITTED (a packed allocation whose granule holds other
  // live allocations that would change state and carry no tag: tag
  // allocations meant for explicit grants, vmmshim_set_allocation_tag, so
  // they get granules of their own), or the driver's cuMemSetAccess error.
  // Granting or revoking the owner itself is a no-op.
  absl::Status GrantPeer(CUdeviceptr ptr, int peer);
  absl::Status RevokePeer(CUdeviceptr ptr, int peer);
  // Whether `peer` can access the allocation containing `ptr` now.
  absl::StatusOr<bool> PeerHasAccess(CUdeviceptr ptr, int peer) const;

  AllocatorStats GetStats() const;
  // One entry per device the shim served, in device order.
  std::vector<DeviceStats> GetDeviceStats() const;
  const PeerPolicy& peer_policy() const { return options_.peer_policy; }

  // Unmaps and releases every handle and frees every reservation, in the
  // guide's order (unmap -> release -> address free). Live allocations become
  // invalid. Returns the first driver error; continues past errors.
  absl::Status ReleaseAll();

 private:
  // One physical handle mapped at its base address.
  struct Block {
    size_t size = 0;  // mapped bytes, a multiple of the granularity
    CUmemGenericAllocationHandle handle = 0;
    CUcontext context = nullptr;
    size_t requested = 0;         // large blocks: the bytes asked for
    std::unique_ptr<Slab> slab;   // packed granules only
    uint64_t allowed = 0;         // devices the policy allows (owner included)
    std::string tag;              // the allocations' tag ("" = none)
    uint64_t explicit_grant = 0;  // GrantPeer: peers granted whatever the policy says
    uint64_t explicit_revoke = 0; // RevokePeer: peers denied whatever the policy says
    uint64_t access = 0;          // devices with read-write access now
    bool sealed = false;          // packed: takes no new allocations
    bool cached = false;          // large: freed, kept mapped for reuse
    bool exportable = false;      // created with the POSIX-fd handle type
    bool exported = false;        // an allocation in it was exported: never cached

    size_t allocations() const { return slab != nullptr ? slab->allocations() : 1; }
    bool has_explicit() const { return (explicit_grant | explicit_revoke) != 0; }
    // The devices that should have access, given the peers that enabled it.
    uint64_t Target(int owner, uint64_t enabled) const {
      const uint64_t self = uint64_t{1} << owner;
      return (((allowed & enabled) | explicit_grant) & ~explicit_revoke) | self;
    }
  };



  struct DeviceHeap {
    DeviceHeap(int device, size_t granularity, size_t reservation_bytes)
        : device(device),
          granularity(granularity),
          reservation_bytes(reservation_bytes),
          arena(granularity) {
      stats.device = device;  // not yet shared, so no lock is needed
    }

    const int device;
    const size_t granularity;
    const size_t reservation_bytes;

    mutable Mutex mu;
    // What cuMemCreate is asked for (handle type, compression); compression
    // is dropped when the driver does not grant it.
    CUmemAllocationProp prop ABSL_GUARDED_BY(mu) = {};
    bool compression_checked ABSL_GUARDED_BY(mu) = false;
    // Exported allocations: base -> token.
    absl::flat_hash_map<CUdeviceptr, std::array<uint8_t, 16>> exports ABSL_GUARDED_BY(mu);
    VaArena arena ABSL_GUARDED_BY(mu);
    // Blocks by base address; boxed so that Block pointers stay valid while
    // the map changes.
    absl::btree_map<CUdeviceptr, std::unique_ptr<Block>> blocks ABSL_GUARDED_BY(mu);
    // Packed granules with free units, by base address.
    absl::btree_set<CUdeviceptr> open_granules ABSL_GUARDED_BY(mu);
    // The cache: freed large blocks and empty granules stay mapped, with their
    // access set, and serve later requests without any driver call, up to
    // `cache_limit` bytes per device.
    size_t cache_limit = 0;
    size_t cached_bytes ABSL_GUARDED_BY(mu) = 0;
    absl::btree_set<std::pair<size_t, CUdeviceptr>> cached_large ABSL_GUARDED_BY(mu);
    absl::btree_set<CUdeviceptr> empty_granules ABSL_GUARDED_BY(mu);
    // Unmapped handles whose cuMemRelease failed, retried later.
    std::vector<CUmemGenericAllocationHandle> orphan_handles ABSL_GUARDED_BY(mu);
    DeviceStats stats ABSL_GUARDED_BY(mu);
    std::array<int, kMaxDevices> denials_logged ABSL_GUARDED_BY(mu){};

    // The block containing `ptr` and its base, or {0, nullptr}.
    std::pair<CUdeviceptr, Block*> BlockAt(CUdeviceptr ptr) const
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      auto it = blocks.upper_bound(ptr);
      if (it == blocks.begin()) return {0, nullptr};
      --it;
      if (ptr >= it->first + it->second->size) return {0, nullptr};
      return {it->first, it->second.get()};
    }
  };

  // The heap of `device`, created on first use; nullptr when the device has
  // no VMM support (logged once per device).
  absl::StatusOr<DeviceHeap*> HeapFor(int device);
  DeviceHeap* HeapOfPointer(CUdeviceptr ptr) const;

  // What a new allocation will be: its context, allowed peers and tag.
  struct Placement {
    CUcontext context;
    uint64_t allowed;
    std::string tag;
  };
  absl::StatusOr<CUdeviceptr> AllocateLarge(DeviceHeap& heap, const Placement& placement,
                                            size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  absl::StatusOr<CUdeviceptr> AllocatePacked(DeviceHeap& heap, const Placement& placement,
                                             size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  // Creates and maps one handle of `size` bytes and grants it to the owner
  // and the peers its placement allows now, in one cuMemSetAccess; undoes
  // itself on failure. Returns the new block's base. Releases heap.mu around
  // the driver calls (held again on return).
  absl::StatusOr<CUdeviceptr> CreateBlock(DeviceHeap& heap, const Placement& placement,
                                          size_t size, bool packed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  // Brings every block's access to its target, batched.
  absl::Status ApplyAccess(DeviceHeap& heap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  // Counts (and logs, rate-limited) the grants and denials of `allocations`
  // allocations allowed `allowed` while `enabled` peers have access enabled.
  void NotePeerDecisions(DeviceHeap& heap, uint64_t allowed, uint64_t enabled,
                         uint64_t allocations, size_t bytes, absl::string_view tag)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  absl::Status SetExplicit(CUdeviceptr ptr, int peer, bool grant);
  void TrimLocked(DeviceHeap& heap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  void ReleaseOrphansLocked(DeviceHeap& heap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  uint64_t EnabledPeers(int owner) const {
    return enabled_mask_[owner].load(std::memory_order_acquire);
  }
  absl::StatusOr<int> DeviceCount();
  // The current context and its device; false when none is current.
  // cuCtxGetCurrent every time (the driver's thread-local read: contexts can
  // change through paths the shim does not see), cuCtxGetDevice only for a
  // context this thread has not met since the last ForgetContext.
  bool CurrentContext(CUcontext* context, int* device);
  absl::Status ReserveMore(DeviceHeap& heap, size_t at_least)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  absl::Status DestroyBlock(DeviceHeap& heap, CUdeviceptr base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  absl::Status SynchronizeContext(CUcontext context);
  // Forgets the export of the allocation at `base`, if any.
  void DropExportLocked(DeviceHeap& heap, CUdeviceptr base) ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  // After cuMemCreate of `handle` with compression requested: did the driver
  // grant it? Falls back (and says so once) when not.
  void CheckCompressionLocked(DeviceHeap& heap, CUmemGenericAllocationHandle handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);
  std::optional<PointerInfo> FindLocked(const DeviceHeap& heap, CUdeviceptr ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heap.mu);

  void AddHandleBytes(int64_t delta);

  const DriverApi& driver_;
  const AllocatorOptions options_;

  Mutex heaps_mu_;  // serializes heap creation only
  std::array<std::atomic<DeviceHeap*>, kMaxDevices> heaps_{};
  std::array<std::atomic<bool>, kMaxDevices> no_vmm_{};

  mutable Mutex ranges_mu_;
  absl::btree_map<CUdeviceptr, std::pair<size_t, int>> ranges_
      ABSL_GUARDED_BY(ranges_mu_);  // reservation base -> (size, device)

  std::atomic<uint64_t> served_allocations_{0}, served_bytes_{0};
  std::atomic<uint64_t> passthrough_allocations_{0}, passthrough_bytes_{0};
  std::atomic<uint64_t> frees_{0}, live_allocations_{0}, live_bytes_{0};
  std::atomic<uint64_t> handles_{0}, handle_bytes_{0}, peak_handle_bytes_{0};

  // Peer enables: peers_mu_ orders EnablePeer/DisablePeer; a heap's mutex is
  // taken after it, never before.
  Mutex peers_mu_;
  std::array<std::array<int, kMaxDevices>, kMaxDevices> enable_counts_
      ABSL_GUARDED_BY(peers_mu_){};  // [owner][peer]
  std::array<std::atomic<uint64_t>, kMaxDevices> enabled_mask_{};  // owner -> peers
  std::atomic<int> device_count_{0};

  // Live exports: token (16 bytes as a string) -> (device, allocation base).
  // Taken after a heap's mutex, never before.
  Mutex exports_mu_;
  absl::flat_hash_map<std::string, std::pair<int, CUdeviceptr>> exports_
      ABSL_GUARDED_BY(exports_mu_);
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_ALLOCATOR_H_

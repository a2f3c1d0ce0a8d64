#include <algorithm>
#include <atomic>
#include <limits>
#include <string>
#include <utility>

#include "core/stream_ordered/stream_ordered_front_end.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/base/log.h"
#include "core/base/round_up.h"
#include "core/sync/shared_gate.h"

namespace vmmshim {
namespace {

// The context and device of recently used streams, per thread, so that a
// cache hit makes no cuStreamGetCtx call. A destroyed stream's handle can
// name a new stream of another context: StreamDestroyed moves the stream
// epoch, ForgetContexts (core/driver/context.h) the context epoch.
std::atomic<uint64_t> g_stream_epoch{1};
struct StreamMemo {
  CUstream stream = nullptr;
  CUcontext context = nullptr;
  int device = -1;
  uint64_t epoch = 0;          // g_stream_epoch when remembered
  uint64_t context_epoch = 0;  // ContextEpoch() when remembered
};
constexpr int kStreamMemos = 4;
thread_local StreamMemo t_stream_memo[kStreamMemos];
thread_local int t_stream_memo_next = 0;

}  // namespace

void StreamOrderedFrontEnd::ForgetStreamMemos() {
  g_stream_epoch.fetch_add(1, std::memory_order_acq_rel);
}

bool StreamOrderedFrontEnd::Resize(CUdeviceptr ptr, size_t bytes) {
  HeapArena* arena = heaps_.Locate(ptr).arena;
  return arena != nullptr && arena->Resize(ptr, bytes);
}

absl::Status StreamOrderedFrontEnd::ResolveStream(CUstream stream, bool per_thread, StreamKey* key,
                                      int* device) {
  if (stream == nullptr) stream = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
  if (stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    // Streams of the current context.
    CUcontext context = nullptr;
    if (!CurrentContext(driver_, &context, device)) {
      return DriverError(CUDA_ERROR_INVALID_CONTEXT, "cuMemAllocAsync");
    }
    *key = StreamKey{stream, context, stream == CU_STREAM_PER_THREAD ? ThisThreadId() : 0};
    return absl::OkStatus();
  }
  const uint64_t epoch = g_stream_epoch.load(std::memory_order_acquire);
  const uint64_t context_epoch = ContextEpoch();
  for (const StreamMemo& m : t_stream_memo) {
    if (m.stream == stream && m.epoch == epoch && m.context_epoch == context_epoch) {
      *key = StreamKey{stream, m.context, 0};
      *device = m.device;
      return absl::OkStatus();
    }
  }
  if (driver_.cuStreamGetCtx == nullptr) {
    return DriverError(CUDA_ERROR_NOT_SUPPORTED, "cuStreamGetCtx");
  }
  CUcontext context = nullptr;
  CUresult r = driver_.cuStreamGetCtx(stream, &context);
  if (r != CUDA_SUCCESS) return DriverError(r, "cuStreamGetCtx");
  CUcontext current = nullptr;
  int d = -1;
  if (CurrentContext(driver_, &current, &d) && current == context) {
    *device = d;
  } else {
    // Another context's stream: its device, with that context current.
    r = driver_.cuCtxPushCurrent_v2(context);
    if (r != CUDA_SUCCESS) return DriverError(r, "cuCtxPushCurrent");
    CUdevice dev = -1;
    r = driver_.cuCtxGetDevice(&dev);
    CUcontext popped = nullptr;
    driver_.cuCtxPopCurrent_v2(&popped);
    if (r != CUDA_SUCCESS) return DriverError(r, "cuCtxGetDevice");
    *device = dev;
  }
  t_stream_memo[t_stream_memo_next] = StreamMemo{stream, context, *device, epoch, context_epoch};
  t_stream_memo_next = (t_stream_memo_next + 1) % kStreamMemos;
  *key = StreamKey{stream, context, 0};
  return absl::OkStatus();
}

size_t StreamOrderedFrontEnd::SizeClass(const DeviceHeap& heap, size_t bytes) {
  return bytes <= heap.packing_threshold() ? RoundUp(bytes, Slab::kUnit)
                                           : RoundUp(bytes, heap.granularity());
}

size_t StreamOrderedFrontEnd::SizeClassOf(const PointerInfo& info) {
  // A large allocation may sit in a cached block somewhat larger than its
  // rounded request: its class is the block's size.
  return info.packed ? RoundUp(info.allocation_size, Slab::kUnit) : info.range_size;
}

void StreamOrderedFrontEnd::ReleaseToHeap(const ReleasedBlocks& blocks) {
  for (const ReleasedBlock& b : blocks) {
    // Their work is done (core/stream_ordered/stream_ordered_cache.h): no
    // synchronization. Only while the heap still holds that allocation of
    // that context there.
    HeapArena* arena = heaps_.Locate(b.ptr).arena;
    absl::Status s = arena == nullptr
                         ? DriverError(CUDA_ERROR_INVALID_VALUE, "stream-ordered release")
                         : arena->FreeStreamOrdered(b.ptr, b.context);
    if (!s.ok()) {
      Log().debug("a freed stream-ordered block at {:#x} was already released: {}", b.ptr,
                  s.ToString());
    }
  }
}

std::optional<PointerInfo> StreamOrderedFrontEnd::Find(CUdeviceptr ptr) const {
  HeapArena* arena = heaps_.Locate(ptr).arena;
  return arena == nullptr ? std::nullopt : arena->Find(ptr);
}

absl::StatusOr<Allocation> StreamOrderedFrontEnd::AllocateAsync(size_t bytes, CUstream stream,
                                                               bool per_thread, CUmemoryPool pool,
                                                               absl::string_view tag,
                                                               uint16_t origin) {
  // A capturing stream records a graph memory node: the driver's (also when
  // the driver cannot say).
  if (captures_.any() && captures_.IsCapturing(stream, per_thread).value_or(true)) {
    return Allocation{};
  }
  StreamKey key;
  int device = -1;
  if (!ResolveStream(stream, per_thread, &key, &device).ok()) return Allocation{};
  const CUmemoryPool default_pool = DefaultPool(device);
  if (default_pool == nullptr) return Allocation{};
  if (pool == nullptr) {
    std::atomic<int>& current = default_pool_current_[device];
    if (current.load(std::memory_order_acquire) == 0 && driver_.cuDeviceGetMemPool != nullptr) {
      CUmemoryPool now = nullptr;
      if (driver_.cuDeviceGetMemPool(&now, device) == CUDA_SUCCESS) {
        CurrentPoolChanged(device, now);
      }
    }
    if (current.load(std::memory_order_acquire) != 1) return Allocation{};
  } else if (pool != default_pool) {
    return Allocation{};  // a pool the program created: the driver's
  }
  absl::StatusOr<DeviceHeap*> heap = heaps_.HeapFor(device);
  if (!heap.ok() || *heap == nullptr) return Allocation{};
  if (bytes > std::numeric_limits<size_t>::max() - (*heap)->granularity()) {
    return DriverError(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocAsync");
  }
  StreamOrderedCache* cache = CacheFor(device);
  const size_t size_class = SizeClass(**heap, bytes);
  // Packed: the same units exactly; large: up to a quarter more, as the
  // heap's cache allows.
  const size_t max_class =
      bytes <= (*heap)->packing_threshold() ? size_class : LargestReusableBlock(size_class);
  absl::StatusOr<int> device_count = heaps_.DeviceCount();
  if (!device_count.ok()) return device_count.status();
  const DeviceSet allowed = policy_.Allowed(device, *device_count, bytes, tag);
  // A block of this placement freed on this stream, or ready; else the
  // streams that may free one for it are asked, with the capture gate held
  // so that no capture begins meanwhile (a query is an unsafe call in a
  // global capture).
  const Placement placement{key.context, allowed, std::string(tag), /*stream_ordered=*/true};
  ReleasedBlocks released;
  std::optional<StreamOrderedCache::Reuse> reuse = cache->Allocate(
      key, placement, size_class, max_class, bytes, /*may_ask=*/false, &released);
  if (!reuse && !captures_.any()) {
    GateReaderLock gate(&captures_.gate());
    if (!captures_.any()) {
      reuse = cache->Allocate(key, placement, size_class, max_class, bytes,
                              /*may_ask=*/true, &released);
    }
  }
  if (!released.empty()) ReleaseToHeap(released);
  if (reuse && heaps_.global().paused.load(std::memory_order_relaxed) > 0) {
    // A block freed while a pause was selecting memory may have been paused
    // since (ReleaseForPause takes the ones freed before): never hand out
    // memory without its physical backing. One atomic load otherwise.
    std::optional<PointerInfo> info = Find(reuse->ptr);
    if (!info || info->paused) {
      cache->NoteFreed(key.context, reuse->size_class, bytes);  // as Allocate counted it
      ReleaseToHeap({{reuse->ptr, key.context}});
      reuse.reset();
    }
  }
  if (reuse) {
    if (reuse->bytes == bytes || Resize(reuse->ptr, bytes)) {
      return Allocation{reuse->ptr, true};
    }
    // Cannot happen for a block of a matching class; keep it correct anyway.
    cache->NoteFreed(key.context, reuse->size_class, bytes);
    ReleaseToHeap({{reuse->ptr, key.context}});
  }
  absl::StatusOr<CUdeviceptr> ptr;
  if (std::optional<CUdeviceptr> hit = (*heap)->AllocateFast(placement, bytes, origin)) {
    ptr = *hit;
  } else {
    ptr = (*heap)->AllocateSlow(placement, bytes, origin);
    if (!ptr.ok() && ToCuResult(ptr.status()) == CUDA_ERROR_OUT_OF_MEMORY) {
      const bool async = Reclaim(-1);  // both run:
      const bool deferred = heaps_.ReclaimDeferred(captures_);  // each may free memory
      if (async || deferred) ptr = (*heap)->AllocateSlow(placement, bytes, origin);
    }
  }
  if (!ptr.ok()) return ptr.status();
  // The class of the block actually served (a cached large block can be
  // larger than the rounded request).
  size_t served_class = size_class;
  if (bytes > (*heap)->packing_threshold()) {
    if (std::optional<PointerInfo> info = Find(*ptr)) served_class = info->range_size;
  }
  cache->NoteAllocated(key.context, served_class, bytes, false);
  return Allocation{*ptr, true};
}

absl::Status StreamOrderedFrontEnd::Free(const PointerInfo& info, CUstream stream,
                                         bool per_thread) {
  // As for other shim memory on a capturing stream (core/sync/capture.h).
  if (captures_.any() && captures_.IsCapturing(stream, per_thread).value_or(false)) {
    return DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync");
  }
  StreamKey key;
  int stream_device = -1;
  if (absl::Status s = ResolveStream(stream, per_thread, &key, &stream_device); !s.ok()) return s;
  StreamOrderedCache* cache = CacheFor(info.device);
  if (info.paused) {
    // Its physical memory is gone: nothing to reuse and no work to wait
    // for (the pause synchronized it). Freed as cuMemFree frees paused
    // memory: its backup dropped, its address range given back.
    cache->NoteFreed(info.context, SizeClassOf(info), info.allocation_size);
    HeapArena* arena = heaps_.Locate(info.allocation_base).arena;
    return arena == nullptr ? DriverError(CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync")
                            : arena->FreeStreamOrdered(info.allocation_base, info.context);
  }
  // Explicit grants belong to this allocation: such a block is not reused.
  const Placement placement{info.context, info.allowed, info.tag, /*stream_ordered=*/true};
  absl::StatusOr<bool> harvest = cache->Put(key, info.allocation_base, placement,
                                            /*reusable=*/!info.has_explicit, SizeClassOf(info),
                                            info.allocation_size);
  if (!harvest.ok()) return harvest.status();
  if (*harvest && !captures_.any()) {
    GateReaderLock gate(&captures_.gate());  // no capture begins during the queries
    if (!captures_.any()) ReleaseToHeap(cache->Harvest());
  }
  return absl::OkStatus();
}

bool StreamOrderedFrontEnd::Reclaim(int device) {
  if (captures_.any()) return false;
  // Held across the check and the synchronizes: a capture begun meanwhile
  // would be invalidated by them.
  GateReaderLock gate(&captures_.gate());
  captures_.Refresh();
  if (captures_.any()) return false;  // contexts cannot be synchronized
  bool any = false;
  for (int d = 0; d < kMaxDevices; ++d) {
    if (device >= 0 && d != device) continue;
    StreamOrderedCache* cache = CacheFor(d);
    if (cache == nullptr) continue;
    std::vector<CUcontext> contexts;
    const uint64_t mark = cache->PendingContexts(&contexts);
    bool synced = true;
    for (CUcontext c : contexts) synced = SynchronizeContext(driver_, c).ok() && synced;
    if (synced) cache->MarkReady(mark);
    const ReleasedBlocks blocks = cache->Harvest(0);
    any = any || !blocks.empty();
    ReleaseToHeap(blocks);
  }
  return any;
}

absl::Status StreamOrderedFrontEnd::ReleaseForPause(const TagSelection& selection) {
  for (int d = 0; d < kMaxDevices; ++d) {
    StreamOrderedCache* cache = CacheFor(d);
    if (cache == nullptr) continue;
    std::vector<CUcontext> contexts;
    const uint64_t mark = cache->PendingContexts(&contexts);
    for (CUcontext c : contexts) {
      if (absl::Status s = SynchronizeContext(driver_, c); !s.ok()) return s;
    }
    cache->MarkReady(mark);
    ReleaseToHeap(cache->TakeSelected(selection));
  }
  return absl::OkStatus();
}

void StreamOrderedFrontEnd::SettleStreamOrdered(int device) {
  StreamOrderedCache* cache = CacheFor(device);
  if (cache == nullptr || captures_.any()) return;
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) return;
  ReleaseToHeap(cache->Harvest());
}

void StreamOrderedFrontEnd::StreamSynchronized(CUstream stream, bool per_thread, uint64_t mark) {
  if (mark == 0) return;
  StreamKey key;
  int device = -1;
  if (!ResolveStream(stream, per_thread, &key, &device).ok()) return;
  for (int d = 0; d < kMaxDevices; ++d) {
    // Blocks of any device may have been freed on this stream.
    if (StreamOrderedCache* cache = CacheFor(d)) {
      ReleaseToHeap(cache->Synchronized(key, /*whole_context=*/false, mark));
    }
  }
}

void StreamOrderedFrontEnd::ContextSynchronized(CUcontext context, uint64_t mark) {
  if (mark == 0) return;
  if (context == nullptr && (driver_.cuCtxGetCurrent(&context) != CUDA_SUCCESS ||
                             context == nullptr)) {
    return;
  }
  StreamKey key;
  key.context = context;
  for (int d = 0; d < kMaxDevices; ++d) {
    if (StreamOrderedCache* cache = CacheFor(d)) {
      ReleaseToHeap(cache->Synchronized(key, /*whole_context=*/true, mark));
    }
  }
}

void StreamOrderedFrontEnd::StreamDestroyed(CUstream stream) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return;
  ForgetStreamMemos();
  // No query or event record while a capture is in progress: the blocks
  // then wait for a context synchronize or an out-of-memory.
  GateReaderLock gate(&captures_.gate());
  const bool may_query = !captures_.any();
  for (auto& slot : caches_) {
    if (StreamOrderedCache* cache = slot.load(std::memory_order_acquire)) {
      cache->StreamDestroyed(stream, may_query);
    }
  }
}

StreamOrderedFrontEnd::StreamOrderedFrontEnd(const DriverApi& driver, HeapTable& heaps,
                                             CaptureTracker& captures, const PeerPolicy& policy,
                                             int64_t query_interval_ns)
    : driver_(driver),
      heaps_(heaps),
      captures_(captures),
      policy_(policy),
      query_interval_ns_(query_interval_ns) {}

StreamOrderedFrontEnd::~StreamOrderedFrontEnd() {
  for (auto& slot : caches_) delete slot.load();
}

void StreamOrderedFrontEnd::HeapCreated(int device) {
  if (!DeviceSet::IsOrdinal(device) || CacheFor(device) != nullptr) return;
  caches_[device].store(new StreamOrderedCache(driver_, query_interval_ns_),
                        std::memory_order_release);
}

bool StreamOrderedFrontEnd::Cached(const PointerInfo& info) const {
  StreamOrderedCache* cache = info.stream_ordered ? CacheFor(info.device) : nullptr;
  return cache != nullptr && cache->Contains(info.allocation_base);
}

void StreamOrderedFrontEnd::NoteFreed(const PointerInfo& info) {
  StreamOrderedCache* cache = info.stream_ordered ? CacheFor(info.device) : nullptr;
  if (cache != nullptr) cache->NoteFreed(info.context, SizeClassOf(info), info.allocation_size);
}

bool StreamOrderedFrontEnd::Holds(CUcontext context) const {
  for (const auto& slot : caches_) {
    StreamOrderedCache* cache = slot.load(std::memory_order_acquire);
    if (cache != nullptr && cache->Holds(context)) return true;
  }
  return false;
}

void StreamOrderedFrontEnd::DropContext(CUcontext context) {
  for (const auto& slot : caches_) {
    if (StreamOrderedCache* cache = slot.load(std::memory_order_acquire)) {
      ReleaseToHeap(cache->DropContext(context));
    }
  }
}

StreamOrderedFigures StreamOrderedFrontEnd::figures(int device) const {
  StreamOrderedCache* cache = CacheFor(device);
  return cache == nullptr ? StreamOrderedFigures{} : cache->figures();
}

void StreamOrderedFrontEnd::PrepareFork() {
  for (auto& slot : caches_) {
    if (StreamOrderedCache* cache = slot.load(std::memory_order_acquire)) cache->PrepareFork();
  }
}

void StreamOrderedFrontEnd::AfterForkParent() {
  for (auto it = caches_.rbegin(); it != caches_.rend(); ++it) {
    if (StreamOrderedCache* cache = it->load(std::memory_order_acquire)) cache->AfterForkParent();
  }
}

void StreamOrderedFrontEnd::AfterForkChild() {
  for (auto& slot : caches_) {
    if (StreamOrderedCache* cache = slot.load(std::memory_order_acquire)) cache->AfterForkChild();
  }
}

}  // namespace vmmshim

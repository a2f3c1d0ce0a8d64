#include "core/heap/pause.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/host_memory.h"
#include "core/base/log.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/heap/backup_copier.h"
#include "core/sync/shared_gate.h"

namespace vmmshim {
namespace {

HostMappedPool::Options HostPoolOptions(const PausedAccessOptions& paused_access,
                                        int copy_threads) {
  HostMappedPool::Options o;
  o.idle_seconds = paused_access.host_pool_idle_seconds;
  o.threads = copy_threads;
  o.make_in_background = paused_access.host_memory_in_background;
  o.max_bytes = paused_access.host_pool_max_bytes;
  return o;
}

// Runs `step` on every arena, even after a failure; the sum of the sizes or
// the first error (commits: every arena must be tried).
// Each memory's `step`, all of them tried; the sum, or the first error.
template <typename Step>
absl::StatusOr<size_t> SumOverAll(const std::vector<PausableMemory*>& memories, Step step) {
  size_t sum = 0;
  absl::Status first;
  for (PausableMemory* memory : memories) {
    absl::StatusOr<size_t> r = step(memory);
    if (r.ok()) {
      sum += *r;
    } else {
      first.Update(r.status());
    }
  }
  if (!first.ok()) return first;
  return sum;
}

// One line per pause or resume: what it moved and where the time went.
void LogTimes(const char* what, const TagSelection& tag, size_t bytes, const PauseTimes& t,
              double total) {
  Log().info("{}({}): {} bytes in {} blocks, {:.3f} ms: synchronize {:.3f} ms, host memory "
             "{:.3f} ms, copies of {} bytes {:.3f} ms ({:.1f} GiB/s), unmap+release {:.3f} ms, "
             "cuMemCreate {:.3f} ms, map+access {:.3f} ms, host mappings {:.3f} ms, caches "
             "released {:.3f} ms",
             what, tag.Describe(), bytes, t.blocks, total * 1e3, t.synchronize * 1e3,
             t.backups * 1e3, t.copied_bytes, t.copy * 1e3, t.CopyBytesPerSecond() / (1u << 30),
             t.release * 1e3, t.create * 1e3, t.map * 1e3, t.views * 1e3, t.trim * 1e3);
}

// A pause or resume that failed because the context is lost (a sticky error
// from an earlier kernel or copy) says so in words, once, instead of through
// whichever driver call met the error first (the staging ring's
// registration, a cuMemCreate): nothing the shim does can bring the memory
// back, and the program should know to restart rather than retry.
absl::Status ExplainLostContext(absl::Status status, const char* call, const TagSelection& tag,
                                bool resume) {
  const CUresult r = ToCuResult(status);
  if (status.ok() || !IsContextLost(r)) return status;
  const std::string what = absl::StrCat(
      call, "(", tag.Describe(), "): the CUDA context is lost (", CuResultName(r),
      " from an earlier kernel or copy; the error is sticky): ",
      resume ? "the kept contents cannot be mapped back; everything stays paused and is lost "
               "with the process"
             : "the pause cannot complete (blocks whose copies completed before the loss may "
               "be paused, the rest stay as they were); the process must restart to use the "
               "GPU again");
  Log().error("{}", what);
  return Reworded(status, what);
}

// Holds every memory's lock (PausableMemory::Lock) for a pause or resume,
// taken in order and given back in reverse.
class MemoriesLock {
 public:
  explicit MemoriesLock(const std::vector<PausableMemory*>& memories) : memories_(memories) {
    for (PausableMemory* m : memories_) m->Lock();
  }
  ~MemoriesLock() {
    for (auto it = memories_.rbegin(); it != memories_.rend(); ++it) (*it)->Unlock();
  }
  MemoriesLock(const MemoriesLock&) = delete;
  MemoriesLock& operator=(const MemoriesLock&) = delete;

 private:
  const std::vector<PausableMemory*>& memories_;
};

// HostMappedPools::SetQuiet for a scope.
class QuietPools {
 public:
  explicit QuietPools(HostMappedPools& pools) : pools_(pools) { pools_.SetQuiet(true); }
  ~QuietPools() { pools_.SetQuiet(false); }
  QuietPools(const QuietPools&) = delete;
  QuietPools& operator=(const QuietPools&) = delete;

 private:
  HostMappedPools& pools_;
};

}  // namespace

PauseCoordinator::PauseCoordinator(const DriverApi& driver, HeapTable& heaps,
                                   CaptureTracker& captures, int copy_threads,
                                   PinnedPoolOptions pinned_pool, PausableMemory* other,
                                   PausedAccessOptions paused_access)
    : driver_(driver),
      heaps_(heaps),
      captures_(captures),
      copy_threads_(copy_threads),
      pinned_pool_options_(pinned_pool),
      other_(other),
      addressable_(paused_access.addressable),
      ring_(driver),
      pool_(driver),
      host_pools_(driver, HostPoolOptions(paused_access, copy_threads)),
      host_memory_in_background_(paused_access.host_memory_in_background) {}

PauseCoordinator::~PauseCoordinator() { StopLateViews(/*at_exit=*/false); }

void PauseCoordinator::AddParticipant(PauseParticipant* participant) {
  MutexLock lock(&mu_);
  participants_.push_back(participant);
}

void PauseCoordinator::HeapCreated(int /*device*/) {
  // A context is current here (the first allocation on a device); the pool
  // starts once, in the first one.
  CUcontext context = nullptr;
  if (pinned_pool_options_.bytes > 0 && driver_.cuCtxGetCurrent(&context) == CUDA_SUCCESS) {
    pool_.Start(pinned_pool_options_.bytes, context, copy_threads_,
                pinned_pool_options_.chunk_bytes);
  }
}

size_t PauseCoordinator::ReleaseHostMemory() {
  size_t released = 0;
  for (HostMappedPool* pool : host_pools_.All()) released += pool->Release();
  return released;
}

size_t PauseCoordinator::ReleaseHostMemoryForGood() {
  StopLateViews(/*at_exit=*/true);
  size_t released = 0;
  for (HostMappedPool* pool : host_pools_.All()) released += pool->ReleaseForGood();
  return released;
}

absl::StatusOr<size_t> PauseCoordinator::ReleaseHostMemoryForCheckpoint() {
  // No late view (Note [Views made late]) takes memory meanwhile.
  WaitingLock lock(this);
  size_t released = 0, taken = 0;
  for (HostMappedPool* pool : host_pools_.All()) {
    const size_t scratch = pool->stats().scratch_bytes;
    released += pool->Release();
    const HostMappedPool::Stats s = pool->stats();
    // A view of the scratch holds it after the pool let it go; nothing is
    // kept or queued after a Release unless a pause came meanwhile.
    taken += s.in_use_bytes + s.kept_bytes + s.queued_bytes + (s.scratch_views > 0 ? scratch : 0);
  }
  if (taken > 0) {
    return Reworded(DriverError(CUDA_ERROR_ILLEGAL_STATE, "sleep"),
                    absl::StrCat(taken, " bytes of host VMM memory are still mapped where paused "
                                        "memory was (a view the driver would not unmap, or "
                                        "memory paused meanwhile); the driver's restore fails "
                                        "on a process that holds host VMM memory, so the "
                                        "process would never wake"));
  }
  return released;
}

size_t PauseCoordinator::UnpinPinnedPool() {
  WaitingLock lock(this);
  return pool_.Unpin();
}

std::vector<PausableMemory*> PauseCoordinator::Memories() const {
  std::vector<PausableMemory*> memories;
  heaps_.ForEach([&](DeviceHeap* heap) {
    heap->ForEachArena([&](HeapArena* arena) { memories.push_back(&arena->pausable()); });
  });
  if (other_ != nullptr) memories.push_back(other_);
  return memories;
}

absl::StatusOr<size_t> PauseCoordinator::Pause(const TagSelection& tag, bool keep_contents,
                                               const BackupKind& kind) {
  absl::StatusOr<size_t> r = PauseSteps(tag, keep_contents, kind);
  if (!r.ok()) return ExplainLostContext(r.status(), "vmmshim_pause_memory", tag, false);
  return r;
}

absl::StatusOr<size_t> PauseCoordinator::Resume(const TagSelection& tag, bool retain_contents) {
  absl::StatusOr<size_t> r = ResumeSteps(tag, retain_contents);
  if (!r.ok()) return ExplainLostContext(r.status(), "vmmshim_resume_memory", tag, true);
  return r;
}

uint64_t PauseCoordinator::paused_bytes() const {
  return heaps_.global().paused.load(std::memory_order_acquire);
}

absl::StatusOr<size_t> PauseCoordinator::PauseSteps(const TagSelection& tag,
                                                     bool keep_contents,
                                                     const BackupKind& kind) {
  // No capture begins meanwhile; during one, the synchronize and the copies
  // would invalidate it (core/sync/capture.h): refused, the capture untouched.
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) {
    return DriverError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "vmmshim_pause_memory");
  }
  WaitingLock lock(this);
  QuietPools quiet(host_pools_);  // Note [The maker keeps quiet] (host_mapped_pool.h)
  const auto start = std::chrono::steady_clock::now();
  PauseTimes times;
  const std::vector<PausableMemory*> memories = Memories();
  for (PausableMemory* memory : memories) {
    if (absl::Status s = memory->CheckPausable(tag); !s.ok()) return s;
  }
  // Freed stream-ordered blocks of the selection are live to the heap until
  // they leave the stream-ordered cache: released first, not backed up.
  for (PauseParticipant* participant : participants_) {
    if (absl::Status s = participant->ReleaseForPause(tag); !s.ok()) return s;
  }
  std::vector<CUcontext> contexts;
  size_t live = 0;
  for (PausableMemory* memory : memories) {
    memory->Lock();
    live += memory->PauseCandidates(tag, &contexts);
    memory->Unlock();
  }
  // Host memory the pause maps at the paused addresses (BackupKind::addressable).
  HostMappedPools* const views = addressable_ && kind.addressable ? &host_pools_ : nullptr;
  // The pinned pool's free part, or the host memory the pools keep, holds
  // that much without new host memory (a fill under way is waited for: the
  // copies would wait for it anyway).
  if (keep_contents) pool_.AwaitFill();
  size_t in_pool = pool_.stats().free_bytes;
  if (views != nullptr) {
    for (HostMappedPool* p : views->All()) in_pool += p->stats().kept_bytes;
  }
  if (keep_contents && kind.directory.empty() && live > in_pool &&
      live - in_pool > AvailableHostMemory()) {
    const HostMemoryHeadroom headroom = HostMemoryHeadroomNow();
    Log().error("vmmshim_pause_memory: host memory for the contents: {} bytes needed ({} of "
                "them in the pinned pool), {} available ({}); nothing paused",
                live, in_pool, headroom.bytes, headroom.limited_by);
    return DriverError(CUDA_ERROR_OUT_OF_MEMORY, "vmmshim_pause_memory (host memory)");
  }
  // The program's work on the memory must be done before it goes.
  auto step = std::chrono::steady_clock::now();
  for (CUcontext ctx : contexts) {
    if (absl::Status s = SynchronizeContext(driver_, ctx); !s.ok()) return s;
  }
  times.synchronize = PauseTimes::Since(step);
  // Taken after the synchronize: the work waited for may need another
  // thread's VMM call (a rank of a single-process NCCL group) to go on.
  MemoriesLock locked(memories);
  std::optional<BackupCopier> copier;
  if (keep_contents) {
    copier.emplace(driver_, ring_, copy_threads_, &pool_, &host_pools_);
    BackupKind chosen = kind;
    chosen.addressable = views != nullptr;
    copier->set_kind(chosen);
  }
  // All or nothing: every memory copies and marks first; only then is
  // memory released anywhere. A failed prepare undoes its own marks; the
  // abort below undoes everyone's, once.
  for (PausableMemory* memory : memories) {
    absl::StatusOr<size_t> r = memory->PausePrepare(tag, copier ? &*copier : nullptr, &times);
    if (!r.ok()) {
      if (copier) copier->Finish().IgnoreError();  // before the backups go
      for (PausableMemory* m : memories) m->PauseAbort(tag);
      return r.status();
    }
  }
  // Each block's memory goes once its own copy is complete, while the
  // copies after it run: Note [A pause's memory goes as its copy
  // completes] (core/heap/pausable_memory.h).
  BackupCopier* const copies = copier ? &*copier : nullptr;
  absl::StatusOr<size_t> released = SumOverAll(memories, [&](PausableMemory* memory) {
    return memory->PauseCommit(tag, copies, views, &times);
  });
  if (copier) {
    // Every copy was waited for above; what is left is the copier's streams.
    if (absl::Status s = copier->Finish(); !s.ok()) {
      Log().warn("vmmshim_pause_memory({}): the pause's copy streams: {}", tag.Describe(),
                 s.ToString());
    }
  }
  if (released.ok() && (*released > 0 || times.blocks > 0)) {
    LogTimes("vmmshim_pause_memory", tag, *released, times, PauseTimes::Since(start));
  }
  if (keep_contents && views != nullptr) ScheduleLateViewsLocked();
  return released;
}

absl::StatusOr<size_t> PauseCoordinator::ResumeSteps(const TagSelection& tag,
                                                      bool retain_contents) {
  GateReaderLock gate(&captures_.gate());
  if (captures_.any()) {
    return DriverError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "vmmshim_resume_memory");
  }
  WaitingLock lock(this);
  QuietPools quiet(host_pools_);  // Note [The maker keeps quiet] (host_mapped_pool.h)
  const auto start = std::chrono::steady_clock::now();
  PauseTimes times;
  // the ring readied only for a copy
  BackupCopier copier(driver_, ring_, copy_threads_, &pool_, &host_pools_);
  HostMappedPools* const views = addressable_ ? &host_pools_ : nullptr;
  const std::vector<PausableMemory*> memories = Memories();
  // Work in flight may be touching paused memory through its views, which
  // the resume takes away: the contexts that own it finish first (outside
  // the memories' locks, as at a pause).
  std::vector<CUcontext> contexts;
  for (PausableMemory* memory : memories) {
    memory->Lock();
    memory->ResumeCandidates(tag, &contexts);
    memory->Unlock();
  }
  const auto sync_start = std::chrono::steady_clock::now();
  for (CUcontext ctx : contexts) {
    if (absl::Status s = SynchronizeContext(driver_, ctx); !s.ok()) return s;
  }
  times.synchronize = PauseTimes::Since(sync_start);
  MemoriesLock locked(memories);
  absl::Status status;
  for (int attempt = 0; attempt < 2; ++attempt) {
    size_t restored = 0;
    status = absl::OkStatus();
    // What a failed attempt copied is copied again.
    times.copied_bytes = 0;
    times.copies_from = {};
    for (PausableMemory* memory : memories) {
      absl::StatusOr<size_t> r = memory->ResumePrepare(tag, copier, views, &times);
      if (!r.ok()) {
        status = r.status();
        break;
      }
      restored += *r;
    }
    if (status.ok()) {
      // The copy engine's copies are complete before the memory is the program's again.
      const auto step = std::chrono::steady_clock::now();
      status = copier.Finish();
      times.copy += PauseTimes::Since(step);
      times.CopiesDone();
      if (!status.ok()) {
        Log().warn("vmmshim_resume_memory({}): restoring contents: {}; everything stays paused",
                   tag.Describe(), status.ToString());
      }
    }
    if (status.ok()) {
      for (PausableMemory* memory : memories) memory->ResumeCommit(tag, retain_contents);
      if (restored > 0) {
        LogTimes("vmmshim_resume_memory", tag, restored, times, PauseTimes::Since(start));
      }
      return restored;
    }
    // All or nothing: what other memories prepared goes again, once (after
    // the copies into it).
    copier.Finish().IgnoreError();
    for (PausableMemory* memory : memories) memory->ResumeAbort(tag, views);
    if (ToCuResult(status) != CUDA_ERROR_OUT_OF_MEMORY) break;
    // Out of memory: every cache the shim holds (deferred frees, the
    // participants' caches, all arenas) goes back to the driver, then once
    // more.
    const auto step = std::chrono::steady_clock::now();
    heaps_.ReclaimDeferred(captures_);
    for (PauseParticipant* participant : participants_) participant->ReleaseCachesForResume();
    heaps_.ForEach([](DeviceHeap* heap) { heap->Trim(); });
    times.trim += PauseTimes::Since(step);
  }
  return status;
}

}  // namespace vmmshim

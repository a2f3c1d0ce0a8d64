// Copies of device memory in host memory, for a pause that keeps contents
// (PauseCoordinator, core/heap/pause.h; docs/pause-resume.md).
//
// The DMA is not the limit, the host memory is: the first touch of each new
// 4 KiB page and pinning are slower than the copy engine (docs/performance.md, "Measurements behind the design": "Host
// backups"). So a backup is new anonymous memory advised for transparent
// huge pages (MADV_HUGEPAGE), written by several threads from a page-locked
// staging ring: the device copies a chunk into one slot while the threads
// copy the previous slot out. Page-locking the ring is a noticeable part of
// a copy, so the ring (StagingRing) is made once and kept for the
// process's life.
//
// Units: bytes. Chunks of kChunkBytes, a ring of two slots.
//
// Errors: a driver failure returns its CUresult in the status
// (core/driver/cu_status.h); host memory that cannot be mapped is
// CUDA_ERROR_OUT_OF_MEMORY with a message naming host memory. A copy that
// failed leaves the destination partly written.
//
// Thread safety: a HostBackup is owned by one block; a BackupCopier is used
// by one thread at a time (it starts and joins its own copy threads) and
// copies in the context current on that thread.
#ifndef VMMSHIM_CORE_HEAP_HOST_BACKUP_H_
#define VMMSHIM_CORE_HEAP_HOST_BACKUP_H_

#include <cuda.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/driver/driver_api.h"
#include "core/heap/host_mapped_pool.h"
#include "core/heap/pinned_pool.h"

namespace vmmshim {

// Where a backup's bytes live (the pause's choice: vmmshim_pause_memory's
// flags, include/vmmshim/vmmshim.h).
struct BackupKind {
  // cuMemHostRegister'ed (portable) after it is made: copies to and from it
  // go straight to the copy engine (no staging ring), and a backup kept
  // across a resume (ArenaPause::ResumeCommit with `retain`) pays the pinning
  // once. Pinning new memory is slower than copying through the ring, so a
  // backup that is not kept is better pageable. A driver that refuses the pinning
  // (a memlock limit) leaves the backup pageable, logged; the pause goes on.
  bool page_locked = false;
  // Non-empty: a file of its own in this directory, mapped shared; written
  // to the disk and dropped from the page cache after the copy (host memory
  // too small for the contents), removed with the backup.
  std::string directory;
  // Host VMM memory from the device's HostMappedPool
  // (core/heap/host_mapped_pool.h), which the pause maps at the paused
  // address so that the memory stays addressable, and scratch memory mapped
  // where contents are dropped; only where VMMSHIM_PAUSED_ACCESS=host
  // (PauseCoordinator decides), never with `directory`. Where the
  // device has none, or the driver refuses it, the backup is made as without
  // it, and that block faults if touched. false: as with
  // VMMSHIM_PAUSED_ACCESS=fault (a deep sleep's pause: nothing runs until
  // the wake).
  bool addressable = true;
};

// Host memory holding one block's contents: anonymous memory (mmap),
// advised MADV_HUGEPAGE, or a file's mapping (BackupKind::directory);
// page-locked when asked. Unregistered, unmapped (and the file removed) at
// destruction. Move-only.
class HostBackup {
 public:
  // `bytes` > 0. CUDA_ERROR_OUT_OF_MEMORY (host memory) when it cannot be
  // mapped or when `bytes` exceeds the MemAvailable of /proc/meminfo (an
  // anonymous mapping succeeds past it and the kernel's OOM killer would
  // end the process at the copy instead).
  static absl::StatusOr<HostBackup> Create(size_t bytes);
  // A new file `name`.XXXXXX in `directory` (mode 0600, made with
  // O_EXCL: never an existing file or a planted link; sized to `bytes`, its
  // blocks allocated now, mapped shared; removed when the backup goes). CUDA_ERROR_INVALID_VALUE naming the path and the system's error
  // when it cannot be made (no such directory, no permission, disk full).
  static absl::StatusOr<HostBackup> CreateInFile(size_t bytes, const std::string& directory,
                                                 const std::string& name);
  // The kind's backup of `bytes` (`name`: its file's, when in a file).
  static absl::StatusOr<HostBackup> Create(size_t bytes, const BackupKind& kind,
                                           const std::string& name);
  // A range of `pool` (page-locked already), or an empty backup (data()
  // null) when the pool has none that large. Given back at destruction.
  static HostBackup FromPool(PinnedPool& pool, size_t bytes);
  // Host VMM memory from `pool` (HostMappedPool::Take), given back to it at
  // destruction; data() is its CPU view.
  static HostBackup FromHostMapped(HostMappedMemory memory, HostMappedPool& pool);
  HostBackup() = default;
  HostBackup(HostBackup&& o) noexcept { *this = std::move(o); }
  HostBackup& operator=(HostBackup&& o) noexcept;
  HostBackup(const HostBackup&) = delete;
  HostBackup& operator=(const HostBackup&) = delete;
  ~HostBackup() { Reset(); }

  // Page-locks it in the current context (cuMemHostRegister, portable);
  // `driver` must outlive it. Nothing to do when locked already; the
  // driver's error otherwise (it stays pageable).
  absl::Status PageLock(const DriverApi& driver);
  // A file's backup: its pages written out (msync) and dropped from the
  // page cache, so that the contents hold disk, not host memory. Nothing
  // for anonymous memory. An I/O error: CUDA_ERROR_UNKNOWN naming the file.
  absl::Status Persist();

  // Empty after, its host VMM memory forgotten (HostMappedMemory::Forget)
  // rather than given back to its pool; other memory is released as at
  // destruction. For memory still mapped where it cannot be unmapped.
  void Abandon();

  char* data() const { return data_; }
  size_t size() const { return size_; }
  bool page_locked() const {
    return driver_ != nullptr || pool_ != nullptr || !host_mapped_.empty();
  }
  // The host VMM memory holding it (FromHostMapped), else nullptr.
  const HostMappedMemory* host_mapped() const {
    return host_mapped_.empty() ? nullptr : &host_mapped_;
  }
  bool from_pool() const { return pool_ != nullptr; }
  bool in_file() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

 private:
  void Reset();

  char* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;                    // a file's backup: removed with it
  const DriverApi* driver_ = nullptr;   // set while page-locked by PageLock
  CUcontext context_ = nullptr;         // current at the registration
  PinnedPool* pool_ = nullptr;          // set for a range of the pinned pool
  HostMappedMemory host_mapped_;        // FromHostMapped
  HostMappedPool* host_pool_ = nullptr; // where host_mapped_ goes back
};

// The host memory available for backups now (HostMemoryHeadroomNow in
// core/base/host_memory.h: MemAvailable, or less in a memory cgroup), or
// SIZE_MAX when it cannot be read.
size_t AvailableHostMemory();

// The staging ring: two slots of page-locked host memory, the shim's own
// (an anonymous mapping) registered with cuMemHostRegister (portable: usable
// from every context). Registered at the first Ready and kept; a context's
// destruction or reset may drop the registration with its context, so Ready
// asks the driver first (cuMemHostGetFlags) and registers again when it was
// dropped. The memory never goes back to the driver, so a dropped
// registration cannot leave the ring pointing into memory someone else got.
// Holds 128 MiB of host memory, page-locked, from the first pause with
// contents to the end of the process (or of its owner).
// Thread safety: one user at a time (the pause coordinator's mutex).
class StagingRing {
 public:
  static constexpr size_t kSlotBytes = size_t{64} << 20;
  static constexpr int kSlots = 2;
  // `driver` must outlive the ring.
  explicit StagingRing(const DriverApi& driver) : driver_(driver) {}
  // Unregisters (when still registered) and unmaps.
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Makes the slots page-locked now, in the current context. Errors:
  // CUDA_ERROR_NOT_SUPPORTED when the driver lacks the calls; host memory
  // that cannot be mapped: CUDA_ERROR_OUT_OF_MEMORY; cuMemHostRegister's.
  absl::Status Ready();
  char* slot(int i) const { return memory_ + static_cast<size_t>(i) * kSlotBytes; }
  // A fork child: the parent's registration means nothing there.
  void AfterForkChild() {
    registered_ = false;
    context_ = nullptr;
  }

 private:
  const DriverApi& driver_;
  char* memory_ = nullptr;  // kSlots * kSlotBytes, mapped at the first Ready
  bool registered_ = false;
  CUcontext context_ = nullptr;  // current at the registration
};

// Copies between device memory and backups. Page-locked backups (the
// pinned pool's, or PageLock'ed) are copied by the copy engine
// asynchronously, on a stream of the copier's own per context (non-blocking,
// so it waits for nothing of the program's: a pause synchronizes the
// program's work first), in parts of at most kCopyPartBytes; Finish waits
// for them. Pageable ones go through the staging ring, synchronously.
class BackupCopier {
 public:
  static constexpr size_t kChunkBytes = StagingRing::kSlotBytes;
  // One copy call of 16 GiB between the H200 and registered memory fails
  // with CUDA_ERROR_INVALID_VALUE (driver 580; 4 GiB parts pass:
  // bench/page_lock_speed); parts of 1 GiB cost nothing measurable.
  static constexpr size_t kCopyPartBytes = size_t{1} << 30;

  // `threads` >= 1 copy threads (the CPUs the process may use, at most 16,
  // is what the measurement above used). `driver`, `ring`, `pool` and
  // `host_pools` (nullable: none) must outlive the copier.
  BackupCopier(const DriverApi& driver, StagingRing& ring, int threads,
               PinnedPool* pool = nullptr, HostMappedPools* host_pools = nullptr);
  // Waits for copies still under way (their errors logged).
  ~BackupCopier();
  BackupCopier(const BackupCopier&) = delete;
  BackupCopier& operator=(const BackupCopier&) = delete;

  // A backup of `bytes` for this pause: a range of the pinned pool when it
  // has one that large (and the kind is not a file), else
  // HostBackup::Create of the kind (in a file named `file_name` when the
  // kind is a directory and `file_name` is not empty; anonymous memory
  // otherwise).
  absl::StatusOr<HostBackup> NewBackup(size_t bytes, const std::string& file_name);
  // Backups for one device's blocks of `sizes`: with BackupKind::addressable,
  // host VMM memory of `device`'s pool (made at once for those it does not
  // keep); the others, and every one without it, as NewBackup makes them
  // (`file_names[i]` names the i-th's file). The first error, nothing kept.
  absl::StatusOr<std::vector<HostBackup>> NewBackups(int device, const std::vector<size_t>& sizes,
                                                     const std::vector<std::string>& file_names);

  // Device memory [src, src + dst.size()) -> `dst`, in the current
  // context: page-locked, started on the copy engine (complete at Finish);
  // else through the staging ring, complete at return; a file's backup is
  // persisted after it.
  absl::Status ToHost(HostBackup& dst, CUdeviceptr src);
  // `src` -> device memory [dst, dst + src.size()), likewise.
  absl::Status ToDevice(CUdeviceptr dst, const HostBackup& src);
  // Device memory [src, src + bytes) -> host `dst`, through the staging ring.
  absl::Status ToHost(char* dst, CUdeviceptr src, size_t bytes);
  // Host `src` -> device memory [dst, dst + bytes), through the staging ring.
  absl::Status ToDevice(CUdeviceptr dst, const char* src, size_t bytes);
  // Waits for every copy started and releases the copier's streams; the
  // first error of a copy or of the wait. Before device memory that was
  // copied from is unmapped, and before resumed memory is handed back.
  absl::Status Finish();

  // The backups this pause makes (PauseCoordinator sets it per pause).
  void set_kind(BackupKind kind) { kind_ = std::move(kind); }
  const BackupKind& kind() const { return kind_; }

 private:
  // The copier's stream in the current context (made at the first use);
  // nullptr where the driver lacks async copies (the copies then wait).
  absl::StatusOr<CUstream> StreamForCurrentContext();
  // `in_pool`: `host` is a range of the pinned pool, copied in parts that
  // each lie in one of its registrations (PinnedPool::PinForCopy).
  absl::Status CopyPageLocked(char* host, CUdeviceptr device, size_t bytes, bool to_host,
                              bool in_pool);
  // Between two device addresses, one of them host VMM memory (its own
  // range), on the copy engine, in parts of kCopyPartBytes.
  absl::Status CopyDeviceToDevice(CUdeviceptr dst, CUdeviceptr src, size_t bytes);

  const DriverApi& driver_;
  StagingRing& ring_;
  const int threads_;
  PinnedPool* const pool_;
  HostMappedPools* const host_pools_;
  int pool_usable_ = -1;  // -1: not asked yet
  BackupKind kind_;
  std::vector<std::pair<CUcontext, CUstream>> streams_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_HOST_BACKUP_H_

// Copies of device memory in host memory, for a pause that keeps contents
// (PauseCoordinator, core/heap/pause.h; docs/pause-resume.md): the host
// memory a backup lives in (HostBackup) and where it comes from
// (BackupKind). The copies themselves: core/heap/backup_copier.h.
//
// The DMA is not the limit, the host memory is: the first touch of each new
// 4 KiB page and pinning are slower than the copy engine (docs/performance.md,
// "Measurements behind the design": "Host backups"). So a backup is new
// anonymous memory advised for transparent huge pages (MADV_HUGEPAGE),
// written by several threads from a page-locked staging ring (StagingRing),
// unless it is page-locked itself.
//
// Units: bytes.
//
// Errors: a driver failure returns its CUresult in the status
// (core/driver/cu_status.h); host memory that cannot be mapped is
// CUDA_ERROR_OUT_OF_MEMORY with a message naming host memory.
//
// Thread safety: a HostBackup is owned by one block.
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

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_HOST_BACKUP_H_

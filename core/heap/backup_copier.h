// The copies between device memory and pause backups (core/heap/host_backup.h):
// BackupCopier, and the staging ring that pageable backups go through.
//
// A pageable backup is written by several threads from a page-locked
// staging ring: the device copies a chunk into one slot while the threads
// copy the previous slot out. Page-locking the ring is a noticeable part of
// a copy, so the ring is made once and kept for the process's life.
//
// Units: bytes. Chunks of kChunkBytes, a ring of two slots.
//
// Errors: a driver failure returns its CUresult in the status
// (core/driver/cu_status.h). A copy that failed leaves the destination
// partly written.
//
// Thread safety: a BackupCopier is used by one thread at a time (it starts
// and joins its own copy threads) and copies in the context current on
// that thread.
#ifndef VMMSHIM_CORE_HEAP_BACKUP_COPIER_H_
#define VMMSHIM_CORE_HEAP_BACKUP_COPIER_H_

#include <cuda.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/driver/driver_api.h"
#include "core/heap/host_backup.h"
#include "core/heap/host_mapped_pool.h"
#include "core/heap/pinned_pool.h"

namespace vmmshim {

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
// pinned pool's, or PageLock'ed) and host VMM memory are copied by the copy
// engine asynchronously, on a stream of the copier's own per context
// (non-blocking, so it waits for nothing of the program's: a pause
// synchronizes the program's work first), in parts of at most
// kCopyPartBytes; WaitCopied waits for one backup's copy, Finish for all.
// Pageable ones go through the staging ring, synchronously.
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
  // Bytes [offset, offset + bytes) of `src` -> device memory [dst, dst +
  // bytes), likewise (a backup that holds several handles' contents side by
  // side: Note [Adjacent handles share one view], core/foreign/foreign_vmm.h).
  // offset + bytes <= src.size().
  absl::Status ToDevice(CUdeviceptr dst, const HostBackup& src, size_t offset, size_t bytes);
  // Device memory [src, src + bytes) -> host `dst`, through the staging ring.
  absl::Status ToHost(char* dst, CUdeviceptr src, size_t bytes);
  // Host `src` -> device memory [dst, dst + bytes), through the staging ring.
  absl::Status ToDevice(CUdeviceptr dst, const char* src, size_t bytes);
  // Waits for the last ToHost into `backup` since the last Finish, so that
  // the device memory it copied from may go while later copies still run
  // (a pause's commit: PausableMemory::PauseCommit); OK at once for a copy
  // that was complete at return, or none. The copy's error, or the wait's.
  absl::Status WaitCopied(const HostBackup& backup);
  // Waits for every copy started and releases the copier's streams; the
  // first error of a copy or of the wait. Before device memory that was
  // copied from is unmapped (or WaitCopied), and before resumed memory is
  // handed back.
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

  // Where WaitCopied finds a backup's copy: the host memory it was copied
  // into.
  static const void* CopyKey(const HostBackup& backup);
  // Marks the copies started on the current context's stream so far as the
  // last into `backup`: an event recorded after them, or (the driver lacks
  // events, or refused one) the stream itself, waited for whole. Nothing
  // where the copies were complete at return.
  void MarkCopied(const HostBackup& backup);

  // A copy started on the copy engine, waited for by WaitCopied.
  struct CopyMark {
    CUevent event = nullptr;    // recorded after it (the copier's, destroyed at Finish)
    CUstream stream = nullptr;  // without an event: the stream it ran on
  };

  const DriverApi& driver_;
  StagingRing& ring_;
  const int threads_;
  PinnedPool* const pool_;
  HostMappedPools* const host_pools_;
  int pool_usable_ = -1;  // -1: not asked yet
  BackupKind kind_;
  std::vector<std::pair<CUcontext, CUstream>> streams_;
  absl::flat_hash_map<const void*, CopyMark> marks_;  // by CopyKey
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_BACKUP_COPIER_H_

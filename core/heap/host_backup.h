// Copies of device memory in host memory, for a pause that keeps contents
// (PauseCoordinator, core/heap/pause.h; docs/pause-resume.md).
//
// Measured on an H200 (bench/backup_bandwidth.cu, docs/pause-resume.md): the
// DMA is not the limit (51 GiB/s from page-locked memory), the host memory
// is: the first touch of each new 4 KiB page and pinning cost 1.4-2.5 GiB/s.
// So a backup is new anonymous memory advised for transparent huge pages
// (MADV_HUGEPAGE), written by several threads from a page-locked staging
// ring: the device copies a chunk into one slot while the threads copy the
// previous slot out (13.8-14.4 GiB/s out, 22-24 GiB/s back with 8 threads).
//
// Units: bytes. Chunks of kChunkBytes, a ring of two slots, made once per
// copier with cuMemHostAlloc in the current context, given back at its
// destruction.
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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/driver/driver_api.h"

namespace vmmshim {

// Anonymous host memory (mmap), advised MADV_HUGEPAGE, unmapped at
// destruction. Move-only.
class HostBackup {
 public:
  // `bytes` > 0. CUDA_ERROR_OUT_OF_MEMORY (host memory) when it cannot be
  // mapped or when `bytes` exceeds the MemAvailable of /proc/meminfo (an
  // anonymous mapping succeeds past it and the kernel's OOM killer would
  // end the process at the copy instead).
  static absl::StatusOr<HostBackup> Create(size_t bytes);
  HostBackup() = default;
  HostBackup(HostBackup&& o) noexcept;
  HostBackup& operator=(HostBackup&& o) noexcept;
  HostBackup(const HostBackup&) = delete;
  HostBackup& operator=(const HostBackup&) = delete;
  ~HostBackup();

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// The host memory available for backups now (MemAvailable of
// /proc/meminfo), or SIZE_MAX when it cannot be read.
size_t AvailableHostMemory();

class BackupCopier {
 public:
  static constexpr size_t kChunkBytes = size_t{64} << 20;

  // `threads` >= 1 copy threads (the CPUs the process may use, at most 8, is
  // what the measurement above used). `driver` must outlive the copier.
  BackupCopier(const DriverApi& driver, int threads);
  ~BackupCopier();
  BackupCopier(const BackupCopier&) = delete;
  BackupCopier& operator=(const BackupCopier&) = delete;

  // Device memory [src, src + bytes) -> host `dst`, in the current context.
  absl::Status ToHost(char* dst, CUdeviceptr src, size_t bytes);
  // Host `src` -> device memory [dst, dst + bytes).
  absl::Status ToDevice(CUdeviceptr dst, const char* src, size_t bytes);

 private:
  absl::Status EnsureRing();

  const DriverApi& driver_;
  const int threads_;
  char* ring_[2] = {nullptr, nullptr};  // page-locked (cuMemHostAlloc)
  CUcontext ring_context_ = nullptr;     // current when the ring was made
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_HOST_BACKUP_H_

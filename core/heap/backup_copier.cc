#include "core/heap/backup_copier.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/log.h"
#include "core/driver/context.h"
#include "core/driver/cu_status.h"
#include "core/driver/host_registration.h"

namespace vmmshim {
namespace {

// `threads` threads copy [src, src + n) to dst, started now; Join waits.
class CopyJob {
 public:
  CopyJob() = default;
  CopyJob(char* dst, const char* src, size_t n, int threads) {
    const size_t parts = std::max<size_t>(1, std::min<size_t>(threads, n >> 20));
    const size_t part = (n + parts - 1) / parts;
    for (size_t t = 0; t < parts; ++t) {
      const size_t from = std::min(n, part * t), to = std::min(n, from + part);
      if (to <= from) continue;
      try {
        workers_.emplace_back([=] { std::memcpy(dst + from, src + from, to - from); });
      } catch (const std::system_error&) {
        // No thread to be had (a pids limit): this part on the calling thread.
        std::memcpy(dst + from, src + from, to - from);
      }
    }
  }
  CopyJob(CopyJob&&) = default;
  CopyJob& operator=(CopyJob&& o) {
    Join();
    workers_ = std::move(o.workers_);
    return *this;
  }
  ~CopyJob() { Join(); }
  void Join() {
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

 private:
  std::vector<std::thread> workers_;
};

}  // namespace

StagingRing::~StagingRing() {
  if (memory_ == nullptr) return;
  if (registered_) UnregisterHostMemory(driver_, memory_, context_, "the pause staging ring");
  munmap(memory_, kSlots * kSlotBytes);
}

absl::Status StagingRing::Ready() {
  if (driver_.cuMemHostRegister_v2 == nullptr || driver_.cuMemHostUnregister == nullptr ||
      driver_.cuMemHostGetFlags == nullptr || driver_.cuMemcpyDtoH_v2 == nullptr ||
      driver_.cuMemcpyHtoD_v2 == nullptr) {
    return DriverError(CUDA_ERROR_NOT_SUPPORTED,
                       "the driver lacks cuMemHostRegister, cuMemHostGetFlags or cuMemcpy");
  }
  if (memory_ == nullptr) {
    void* p = mmap(nullptr, kSlots * kSlotBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return DriverError(CUDA_ERROR_OUT_OF_MEMORY,
                         absl::StrCat("host memory for the pause staging ring: ",
                                      std::strerror(errno)));
    }
    memory_ = static_cast<char*>(p);
  }
  if (registered_ && HostRegistrationAlive(driver_, memory_, context_)) return absl::OkStatus();
  registered_ = false;  // never, or dropped with its context
  if (CUresult r = driver_.cuMemHostRegister_v2(memory_, kSlots * kSlotBytes,
                                                CU_MEMHOSTREGISTER_PORTABLE);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemHostRegister (pause staging ring)");
  }
  registered_ = true;
  driver_.cuCtxGetCurrent(&context_);
  return absl::OkStatus();
}

BackupCopier::BackupCopier(const DriverApi& driver, StagingRing& ring, int threads,
                           PinnedPool* pool, HostMappedPools* host_pools)
    : driver_(driver),
      ring_(ring),
      threads_(std::max(1, threads)),
      pool_(pool),
      host_pools_(host_pools) {}

BackupCopier::~BackupCopier() {
  if (absl::Status s = Finish(); !s.ok()) {
    Log().warn("pause copies left when the copier went: {}", s.ToString());
  }
}

absl::StatusOr<HostBackup> BackupCopier::NewBackup(size_t bytes, const std::string& file_name) {
  const bool in_file = !kind_.directory.empty() && !file_name.empty();
  if (pool_ != nullptr && !in_file) {
    if (pool_usable_ < 0) pool_usable_ = pool_->Usable() ? 1 : 0;
    if (pool_usable_ == 1) {
      HostBackup b = HostBackup::FromPool(*pool_, bytes);
      if (b.data() != nullptr) return b;
    }
  }
  return in_file ? HostBackup::CreateInFile(bytes, kind_.directory, file_name)
                 : HostBackup::Create(bytes);
}

absl::StatusOr<std::vector<HostBackup>> BackupCopier::NewBackups(
    int device, const std::vector<size_t>& sizes, const std::vector<std::string>& file_names) {
  std::vector<HostBackup> out(sizes.size());
  std::vector<bool> made(sizes.size(), false);
  HostMappedPool* host_pool = kind_.addressable && kind_.directory.empty() && host_pools_ != nullptr
                                  ? host_pools_->For(device)
                                  : nullptr;
  if (host_pool != nullptr) {
    std::vector<size_t> wanted;  // indexes of `sizes` the node's granularity divides
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] % host_pool->node().granularity == 0) wanted.push_back(i);
    }
    std::vector<size_t> wanted_sizes;
    for (size_t i : wanted) wanted_sizes.push_back(sizes[i]);
    std::vector<absl::StatusOr<HostMappedMemory>> taken = host_pool->Take(wanted_sizes);
    size_t refused = 0, later = 0, capped = 0;
    absl::Status why;
    for (size_t k = 0; k < wanted.size(); ++k) {
      if (absl::IsUnavailable(taken[k].status())) {  // VMMSHIM_HOST_POOL_MAKE=background
        later += wanted_sizes[k];
        continue;
      }
      if (absl::IsOutOfRange(taken[k].status())) {  // VMMSHIM_HOST_POOL_MAX
        capped += wanted_sizes[k];
        continue;
      }
      if (!taken[k].ok()) {
        refused += wanted_sizes[k];
        why.Update(taken[k].status());
        continue;
      }
      out[wanted[k]] = HostBackup::FromHostMapped(*std::move(taken[k]), *host_pool);
      made[wanted[k]] = true;
    }
    if (later > 0) {
      Log().info("device {}: {} bytes of paused contents kept in other host memory (they fault "
                 "if touched while paused); their host VMM memory is being made in the "
                 "background for the next pause",
                 device, later);
    }
    if (capped > 0) {
      Log().info("device {}: {} bytes of paused contents kept in other host memory (they fault "
                 "if touched while paused): VMMSHIM_HOST_POOL_MAX holds no more",
                 device, capped);
    }
    if (refused > 0) {
      Log().warn("device {}: host VMM memory for {} bytes of paused contents: {}; those are "
                 "kept in other host memory and fault if touched while paused",
                 device, refused, why.ToString());
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (made[i]) continue;
    absl::StatusOr<HostBackup> b = NewBackup(sizes[i], file_names[i]);
    if (!b.ok()) return b.status();
    out[i] = *std::move(b);
  }
  return out;
}

absl::StatusOr<CUstream> BackupCopier::StreamForCurrentContext() {
  if (driver_.cuStreamCreate == nullptr || driver_.cuStreamSynchronize == nullptr ||
      driver_.cuStreamDestroy_v2 == nullptr || driver_.cuMemcpyDtoHAsync_v2 == nullptr ||
      driver_.cuMemcpyHtoDAsync_v2 == nullptr) {
    return nullptr;
  }
  CUcontext current = nullptr;
  if (CUresult r = driver_.cuCtxGetCurrent(&current); r != CUDA_SUCCESS) {
    return DriverError(r, "cuCtxGetCurrent");
  }
  for (const auto& [context, stream] : streams_) {
    if (context == current) return stream;
  }
  CUstream stream = nullptr;
  if (CUresult r = driver_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS) {
    return DriverError(r, "cuStreamCreate (pause copies)");
  }
  streams_.push_back({current, stream});
  return stream;
}

absl::Status BackupCopier::CopyPageLocked(char* host, CUdeviceptr device, size_t bytes,
                                          bool to_host, bool in_pool) {
  absl::StatusOr<CUstream> stream = StreamForCurrentContext();
  if (!stream.ok()) return stream.status();
  for (size_t off = 0, n; off < bytes; off += n) {
    n = std::min(kCopyPartBytes, bytes - off);
    if (in_pool) {  // one registration per copy, pinned again if it was given back
      absl::StatusOr<size_t> span = pool_->PinForCopy(host + off, n);
      if (!span.ok()) return span.status();
      n = *span;
    }
    CUresult r;
    if (*stream == nullptr) {
      r = to_host ? driver_.cuMemcpyDtoH_v2(host + off, device + off, n)
                  : driver_.cuMemcpyHtoD_v2(device + off, host + off, n);
    } else {
      r = to_host ? driver_.cuMemcpyDtoHAsync_v2(host + off, device + off, n, *stream)
                  : driver_.cuMemcpyHtoDAsync_v2(device + off, host + off, n, *stream);
    }
    if (r != CUDA_SUCCESS) {
      return DriverError(r, to_host ? "cuMemcpyDtoHAsync (backup)" : "cuMemcpyHtoDAsync (restore)");
    }
  }
  return absl::OkStatus();
}

const void* BackupCopier::CopyKey(const HostBackup& backup) {
  if (const HostMappedMemory* m = backup.host_mapped()) {
    return reinterpret_cast<const void*>(m->address());
  }
  return backup.data();
}

void BackupCopier::MarkCopied(const HostBackup& backup) {
  absl::StatusOr<CUstream> current = StreamForCurrentContext();
  if (!current.ok() || *current == nullptr) return;  // the copies were complete at return
  const CUstream stream = *current;
  CopyMark& mark = marks_[CopyKey(backup)];
  // A backup written again in this pause (never, today) keeps one mark: the
  // latest copy's.
  if (mark.event == nullptr && driver_.cuEventCreate != nullptr &&
      driver_.cuEventRecord != nullptr && driver_.cuEventSynchronize != nullptr &&
      driver_.cuEventCreate(&mark.event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    mark.event = nullptr;
  }
  if (mark.event != nullptr && driver_.cuEventRecord(mark.event, stream) == CUDA_SUCCESS) {
    mark.stream = nullptr;
    return;
  }
  mark.stream = stream;  // waited for whole
}

absl::Status BackupCopier::WaitCopied(const HostBackup& backup) {
  auto it = marks_.find(CopyKey(backup));
  if (it == marks_.end()) return absl::OkStatus();  // complete at return, or never copied
  const CopyMark mark = it->second;
  if (mark.stream != nullptr) {
    return DriverError(driver_.cuStreamSynchronize(mark.stream),
                       "cuStreamSynchronize (pause copies)");
  }
  return DriverError(driver_.cuEventSynchronize(mark.event), "cuEventSynchronize (pause copy)");
}

absl::Status BackupCopier::Finish() {
  absl::Status first;
  for (auto& [key, mark] : marks_) {
    if (mark.event != nullptr) driver_.cuEventDestroy_v2(mark.event);
  }
  marks_.clear();
  for (const auto& [context, stream] : streams_) {
    ContextScope scope(driver_, context);  // the caller may have none current
    if (CUresult r = driver_.cuStreamSynchronize(stream); r != CUDA_SUCCESS) {
      first.Update(DriverError(r, "cuStreamSynchronize (pause copies)"));
    }
    driver_.cuStreamDestroy_v2(stream);
  }
  streams_.clear();
  return first;
}

absl::Status BackupCopier::CopyDeviceToDevice(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (driver_.cuMemcpyDtoDAsync_v2 == nullptr || driver_.cuMemcpyDtoD_v2 == nullptr) {
    return DriverError(CUDA_ERROR_NOT_SUPPORTED, "the driver lacks cuMemcpyDtoD");
  }
  absl::StatusOr<CUstream> stream = StreamForCurrentContext();
  if (!stream.ok()) return stream.status();
  for (size_t off = 0, n; off < bytes; off += n) {
    n = std::min(kCopyPartBytes, bytes - off);
    CUresult r = *stream == nullptr
                     ? driver_.cuMemcpyDtoD_v2(dst + off, src + off, n)
                     : driver_.cuMemcpyDtoDAsync_v2(dst + off, src + off, n, *stream);
    if (r != CUDA_SUCCESS) return DriverError(r, "cuMemcpyDtoD (host VMM memory)");
  }
  // No stream of the copier's (the driver lacks the calls it needs), so
  // Finish waits for nothing: a copy between device addresses is
  // asynchronous to the host even without a stream (the driver API's "API
  // synchronization behavior"), so the context is waited for here.
  if (*stream == nullptr) {
    return DriverError(driver_.cuCtxSynchronize(), "cuCtxSynchronize (host VMM memory)");
  }
  return absl::OkStatus();
}

absl::Status BackupCopier::ToHost(HostBackup& dst, CUdeviceptr src) {
  if (const HostMappedMemory* m = dst.host_mapped()) {
    absl::Status s = CopyDeviceToDevice(m->address(), src, dst.size());
    if (s.ok()) MarkCopied(dst);
    return s;
  }
  if (dst.page_locked()) {
    if (absl::Status s = CopyPageLocked(dst.data(), src, dst.size(), true, dst.from_pool()); !s.ok()) return s;
    MarkCopied(dst);
  } else if (absl::Status s = ToHost(dst.data(), src, dst.size()); !s.ok()) {
    return s;
  }
  return dst.Persist();
}

absl::Status BackupCopier::ToDevice(CUdeviceptr dst, const HostBackup& src) {
  return ToDevice(dst, src, 0, src.size());
}

absl::Status BackupCopier::ToDevice(CUdeviceptr dst, const HostBackup& src, size_t offset,
                                    size_t bytes) {
  if (const HostMappedMemory* m = src.host_mapped()) {
    return CopyDeviceToDevice(dst, m->address() + offset, bytes);
  }
  if (!src.page_locked()) return ToDevice(dst, src.data() + offset, bytes);
  return CopyPageLocked(src.data() + offset, dst, bytes, false, src.from_pool());
}

absl::Status BackupCopier::ToHost(char* dst, CUdeviceptr src, size_t bytes) {
  if (absl::Status s = ring_.Ready(); !s.ok()) return s;
  // The device fills one slot while the threads empty the other.
  CopyJob draining;
  for (size_t off = 0, c = 0; off < bytes; off += kChunkBytes, ++c) {
    const size_t n = std::min(kChunkBytes, bytes - off);
    char* slot = ring_.slot(c % 2);
    if (CUresult r = driver_.cuMemcpyDtoH_v2(slot, src + off, n); r != CUDA_SUCCESS) {
      return DriverError(r, "cuMemcpyDtoH (backup)");
    }
    draining = CopyJob(dst + off, slot, n, threads_);  // joins the previous slot's job first
  }
  draining.Join();
  return absl::OkStatus();
}

absl::Status BackupCopier::ToDevice(CUdeviceptr dst, const char* src, size_t bytes) {
  if (absl::Status s = ring_.Ready(); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  // The threads fill the next slot while the device empties this one.
  CopyJob filling(ring_.slot(0), src, std::min(kChunkBytes, bytes), threads_);
  for (size_t off = 0, c = 0; off < bytes; off += kChunkBytes, ++c) {
    const size_t n = std::min(kChunkBytes, bytes - off);
    filling.Join();
    const size_t next = off + kChunkBytes;
    if (next < bytes) {
      filling = CopyJob(ring_.slot((c + 1) % 2), src + next,
                        std::min(kChunkBytes, bytes - next), threads_);
    }
    if (CUresult r = driver_.cuMemcpyHtoD_v2(dst + off, ring_.slot(c % 2), n);
        r != CUDA_SUCCESS) {
      return DriverError(r, "cuMemcpyHtoD (restore)");
    }
  }
  return absl::OkStatus();
}

}  // namespace vmmshim

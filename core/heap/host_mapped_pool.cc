#include "core/heap/host_mapped_pool.h"

#include <algorithm>
#include <atomic>
#include <new>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/host_memory.h"
#include "core/base/log.h"
#include "core/driver/cu_status.h"
#include "core/driver/vmm_mapping.h"
#include "core/sync/capture.h"

namespace vmmshim {

HostMappedPool::HostMappedPool(const DriverApi& driver, int device, HostNode node, Options options)
    : driver_(driver),
      device_(device),
      node_(node),
      options_(options),
      last_use_(std::chrono::steady_clock::now()) {}

HostMappedPool::~HostMappedPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  // The maker first: what it keeps meanwhile starts no trimmer (stopping_).
  if (maker_.joinable()) maker_.join();
  if (trimmer_.joinable()) trimmer_.join();
}

std::vector<absl::StatusOr<HostMappedMemory>> HostMappedPool::Take(
    const std::vector<size_t>& sizes) {
  std::vector<absl::StatusOr<HostMappedMemory>> out(sizes.size());
  std::vector<size_t> missing;  // indexes of `sizes` to make
  std::multimap<size_t, HostMappedMemory> unmatched;  // released before making
  {
    MutexLock lock(&mu_);
    last_use_ = std::chrono::steady_clock::now();
    figures_.limited_by.clear();  // what cuts this pause's, from here on
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto it = kept_.find(sizes[i]);
      if (it == kept_.end()) {
        missing.push_back(i);
        continue;
      }
      kept_bytes_ -= it->first;
      in_use_bytes_ += it->first;
      figures_.reused_bytes += it->first;
      out[i] = std::move(it->second);
      kept_.erase(it);
    }
    // Kept memory of other sizes gives way when what is to be made would
    // not fit beside it (it is page-locked: the kernel cannot reclaim it).
    // In the background the maker does that, off the pause's path.
    size_t to_make = 0;
    for (size_t i : missing) to_make += sizes[i];
    if (to_make > 0 && !kept_.empty() && !options_.make_in_background) {
      HostMemoryHeadroom headroom = HostMemoryHeadroomUnder(options_.headroom_root);
      if (OverMaxLocked(to_make)) headroom = MaxAsHeadroomLocked();
      if (headroom.bytes != SIZE_MAX && to_make > headroom.bytes) {
        Log().info("device {}: {} bytes of host memory kept for paused contents of other sizes "
                   "released: {} bytes are to be made and {} are left ({})",
                   device_, kept_bytes_, to_make, headroom.bytes, headroom.limited_by);
        figures_.limited_by = headroom.limited_by;
        figures_.trimmed_bytes += kept_bytes_;
        unmatched = std::move(kept_);
        kept_.clear();
        kept_bytes_ = 0;
        ++releasing_;
      }
    }
    // What would take the pool past Options::max_bytes is neither made nor
    // queued: kept as fault keeps it. What is queued already counts, once;
    // kept memory counts where the pause makes (in the background the maker
    // gives it way, GiveWayLocked).
    if (options_.max_bytes > 0) {
      size_t held = in_use_bytes_ + queued_size_bytes() +
                    (options_.make_in_background ? 0 : kept_bytes_);
      std::map<size_t, size_t> counted;  // per size, queued entries this pause may count on
      for (size_t q : queued_) ++counted[q];
      for (const auto& [size, claimed] : claimed_) {
        size_t& n = counted[size];
        n -= std::min(n, claimed);
      }
      std::vector<size_t> within;
      for (size_t i : missing) {
        if (size_t& n = counted[sizes[i]]; n > 0) {
          --n;
          within.push_back(i);
        } else if (held + sizes[i] <= options_.max_bytes) {
          held += sizes[i];
          within.push_back(i);
        } else {
          out[i] = absl::OutOfRangeError(absl::StrCat(
              "VMMSHIM_HOST_POOL_MAX (", options_.max_bytes, " bytes) would be passed"));
          figures_.limited_by = MaxAsHeadroomLocked().limited_by;
        }
      }
      missing = std::move(within);
    }
    if (options_.make_in_background && !missing.empty()) {
      // Queued once per size missing: what is queued already counts, but
      // not what another memory's Take of this pause counted on (Note [A
      // pause's memories share the queue]). A fork's child has no maker:
      // nothing is queued there.
      std::map<size_t, size_t> wanted;
      for (size_t i : missing) ++wanted[sizes[i]];
      for (const auto& [size, n] : wanted) {
        size_t& claimed = claimed_[size];
        const size_t queued = queued_.count(size);
        for (size_t q = queued - std::min(queued, claimed); q < n && !in_fork_child_; ++q) {
          queued_.insert(size);
        }
        claimed += n;
      }
      if (!quiet_) claimed_.clear();  // a Take outside a pause counts alone
      for (size_t i : missing) {
        out[i] = absl::UnavailableError("host memory for paused contents is being made in the "
                                        "background, for the next pause");
      }
      if (!maker_.joinable() && !stopping_ && !in_fork_child_) {
        try {
          maker_ = std::thread([this] {
            RelaxCaptureModeOfThisThread(driver_);  // Note [The shim's own threads and captures]
            MakeQueued();
          });
        } catch (const std::system_error&) {
          queued_.clear();  // no thread: as before, nothing is made
        }
      }
      missing.clear();
    }
    changed_.SignalAll();
  }
  if (!unmatched.empty()) ReleaseCounted(unmatched);  // outside the lock
  if (missing.empty()) return out;
  // Made by several threads at once: the driver pins each handle's pages as
  // it makes them (bench/host_vmm_costs).
  const auto start = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0};
  auto make = [&] {
    for (size_t k; (k = next.fetch_add(1)) < missing.size();) {
      const size_t i = missing[k];
      out[i] = HostMappedMemory::Create(driver_, node_, device_, sizes[i]);
    }
  };
  std::vector<std::thread> makers;
  const int threads = std::clamp<int>(options_.threads, 1, static_cast<int>(missing.size()));
  for (int t = 1; t < threads; ++t) {
    try {
      makers.emplace_back(make);
    } catch (const std::system_error&) {
      break;  // no thread to be had (a pids limit): fewer makers
    }
  }
  make();
  for (std::thread& t : makers) t.join();
  MutexLock lock(&mu_);
  figures_.make_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i : missing) {
    if (!out[i].ok()) continue;
    figures_.made_bytes += sizes[i];
    in_use_bytes_ += sizes[i];
  }
  return out;
}

absl::StatusOr<HostMappedMemory> HostMappedPool::TakeKept(size_t size) {
  MutexLock lock(&mu_);
  auto it = kept_.find(size);
  if (it == kept_.end()) {
    return absl::NotFoundError(absl::StrCat("no host memory of ", size, " bytes kept"));
  }
  last_use_ = std::chrono::steady_clock::now();
  kept_bytes_ -= size;
  in_use_bytes_ += size;
  figures_.reused_bytes += size;
  HostMappedMemory memory = std::move(it->second);
  kept_.erase(it);
  return memory;
}

void HostMappedPool::Give(HostMappedMemory memory) {
  if (memory.empty()) return;
  MutexLock lock(&mu_);
  if (in_fork_child_) {
    memory.Forget();
    return;
  }
  in_use_bytes_ -= std::min(in_use_bytes_, memory.size());
  last_use_ = std::chrono::steady_clock::now();
  KeepLocked(std::move(memory));
}

bool HostMappedPool::OverMaxLocked(size_t size) const {
  return options_.max_bytes > 0 && kept_bytes_ + in_use_bytes_ + size > options_.max_bytes;
}

HostMemoryHeadroom HostMappedPool::MaxAsHeadroomLocked() const {
  HostMemoryHeadroom h;
  const size_t held = kept_bytes_ + in_use_bytes_;
  h.bytes = options_.max_bytes > held ? options_.max_bytes - held : 0;
  h.limited_by = absl::StrCat("VMMSHIM_HOST_POOL_MAX (", options_.max_bytes, " bytes)");
  return h;
}

bool HostMappedPool::FitsLocked(size_t size, HostMemoryHeadroom* headroom) const {
  if (OverMaxLocked(size)) {
    *headroom = MaxAsHeadroomLocked();
    return false;
  }
  // Kept only while the pool holds at most 3/4 of what it holds plus what
  // the host has left: page-locked memory is never reclaimed.
  *headroom = HostMemoryHeadroomUnder(options_.headroom_root);
  const size_t held = kept_bytes_ + in_use_bytes_ + size;
  return headroom->bytes == SIZE_MAX || held / 3 <= headroom->bytes;
}

void HostMappedPool::KeepLocked(HostMappedMemory memory) {
  const size_t size = memory.size();
  HostMemoryHeadroom headroom;
  if (!FitsLocked(size, &headroom)) {
    if (!keep_logged_) {
      keep_logged_ = true;
      Log().info("device {}: host memory for paused contents: {} bytes released rather than "
                 "kept for the next pause: the pool would hold {} bytes with {} left ({})",
                 device_, size, kept_bytes_ + in_use_bytes_ + size, headroom.bytes,
                 headroom.limited_by);
    }
    figures_.limited_by = headroom.limited_by;
    figures_.trimmed_bytes += size;
    return;  // `memory` is released as it goes
  }
  kept_bytes_ += size;
  kept_.emplace(size, std::move(memory));
  if (options_.idle_seconds > 0 && !stopping_ && !trimmer_.joinable()) {
    try {
      trimmer_ = std::thread([this] {
        RelaxCaptureModeOfThisThread(driver_);  // Note [The shim's own threads and captures]
        TrimWhenIdle();
      });
    } catch (const std::system_error&) {
      // No thread: the pool keeps its memory until exit or Trim.
    }
  }
  changed_.SignalAll();
}

void HostMappedPool::ReleaseCounted(std::multimap<size_t, HostMappedMemory>& going) {
  going.clear();
  MutexLock lock(&mu_);
  --releasing_;
  changed_.SignalAll();
}

void HostMappedPool::TrimWhenIdle() {
  const absl::Duration idle = absl::Seconds(options_.idle_seconds);
  for (;;) {
    std::multimap<size_t, HostMappedMemory> going;
    size_t released = 0;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      if (kept_.empty()) {
        changed_.Wait(&mu_);
        continue;
      }
      const absl::Duration since =
          absl::FromChrono(std::chrono::steady_clock::now() - last_use_);
      if (since < idle) {
        changed_.WaitWithTimeout(&mu_, idle - since);
        continue;
      }
      going = std::move(kept_);
      kept_.clear();
      released = kept_bytes_;
      kept_bytes_ = 0;
      figures_.trimmed_bytes += released;
      ++releasing_;
    }
    // Released outside the lock: cuMemRelease of pinned memory takes time.
    ReleaseCounted(going);
    Log().info("device {}: {} bytes of host memory for paused contents released: unused for "
               "{} s",
               device_, released, options_.idle_seconds);
  }
}

size_t HostMappedPool::Trim() {
  std::multimap<size_t, HostMappedMemory> going;
  size_t released;
  {
    MutexLock lock(&mu_);
    queued_.clear();
    going = std::move(kept_);
    kept_.clear();
    released = kept_bytes_;
    kept_bytes_ = 0;
    figures_.trimmed_bytes += released;
    ++releasing_;
  }
  ReleaseCounted(going);  // outside the lock
  return released;
}

size_t HostMappedPool::ReleaseForGood() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;  // the maker and the trimmer stop; nothing more is made
    changed_.SignalAll();
  }
  return Release();
}

size_t HostMappedPool::Release() {
  {
    // What is being made goes too: released by the maker, as the queue is
    // empty when it is done.
    MutexLock lock(&mu_);
    queued_.clear();
    while (making_) changed_.Wait(&mu_);
  }
  size_t released = Trim();
  HostMappedMemory scratch, large_scratch;
  {
    MutexLock lock(&mu_);
    released += scratch_.size() + large_scratch_.size();
    scratch = std::move(scratch_);
    large_scratch = std::move(large_scratch_);
  }
  {  // released here, outside the lock
    HostMappedMemory going = std::move(scratch), large_going = std::move(large_scratch);
  }
  // Releases other threads began (the idle trimmer, a Trim, a pause's give
  // way) are done too: none of the pool's driver calls outlives this.
  MutexLock lock(&mu_);
  while (releasing_ > 0 || making_) changed_.Wait(&mu_);
  return released;
}

HostMappedPool::Stats HostMappedPool::stats() const {
  MutexLock lock(&mu_);
  Stats s = figures_;
  s.kept_bytes = kept_bytes_;
  s.in_use_bytes = in_use_bytes_;
  s.scratch_bytes = scratch_.size() + large_scratch_.size();
  s.scratch_views = scratch_views_;
  s.queued_bytes = queued_size_bytes();
  return s;
}

void HostMappedPool::AfterForkChild() {
  new (&trimmer_) std::thread();
  new (&maker_) std::thread();
  new (&mu_) Mutex;
  new (&changed_) CondVar;
  // The parent's handles are not the child's: forgotten, never released.
  for (auto& [size, memory] : kept_) memory.Forget();
  kept_.clear();
  scratch_.Forget();
  large_scratch_.Forget();
  scratch_views_ = 0;
  queued_.clear();
  making_ = false;
  releasing_ = 0;
  kept_bytes_ = 0;
  in_use_bytes_ = 0;
  in_fork_child_ = true;  // what the child's paused blocks give back is the parent's too
}

void HostMappedPools::PrepareFork() {
  mu_.Lock();
  for (auto& [device, pool] : pools_) {
    if (pool != nullptr) pool->mu_.Lock();
  }
}

void HostMappedPools::AfterForkParent() {
  for (auto it = pools_.rbegin(); it != pools_.rend(); ++it) {
    if (it->second != nullptr) it->second->mu_.Unlock();
  }
  mu_.Unlock();
}

HostMappedPool* HostMappedPools::For(int device) {
  MutexLock lock(&mu_);
  auto it = pools_.find(device);
  if (it != pools_.end()) return it->second.get();
  const HostNode node = HostNode::Query(driver_, device);
  std::unique_ptr<HostMappedPool> pool;
  if (node.supported) {
    pool = std::make_unique<HostMappedPool>(driver_, device, node, options_);
    if (quiet_) pool->SetQuiet(true);
  } else {
    Log().info("device {}: no host VMM memory (CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_"
               "MANAGEMENT_SUPPORTED): its paused memory is not addressable; an access faults",
               device);
  }
  return pools_.emplace(device, std::move(pool)).first->second.get();
}

void HostMappedPools::SetQuiet(bool quiet) {
  MutexLock lock(&mu_);
  quiet_ = quiet;
  for (auto& [device, pool] : pools_) {
    if (pool != nullptr) pool->SetQuiet(quiet);
  }
}

std::vector<HostMappedPool*> HostMappedPools::All() const {
  MutexLock lock(&mu_);
  std::vector<HostMappedPool*> out;
  for (const auto& [device, pool] : pools_) {
    if (pool != nullptr) out.push_back(pool.get());
  }
  return out;
}

void HostMappedPools::AfterForkChild() {
  new (&mu_) Mutex;
  for (auto& [device, pool] : pools_) {
    if (pool != nullptr) pool->AfterForkChild();
  }
}

}  // namespace vmmshim

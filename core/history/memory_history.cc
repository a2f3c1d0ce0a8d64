#include "core/history/memory_history.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <new>

namespace vmmshim {
namespace {

constexpr absl::string_view kActionNames[kHistoryActions] = {
    "alloc",        "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map",  "segment_unmap",  "oom",            "snapshot",      "peer_enable",
    "peer_disable", "peer_grant",     "peer_deny",      "pause_begin",   "pause_end",
    "resume_begin", "resume_end",
};

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint32_t ThreadId() {
  thread_local const auto tid = static_cast<uint32_t>(syscall(SYS_gettid));
  return tid;
}

}  // namespace

absl::string_view HistoryActionName(HistoryAction action) {
  const int i = static_cast<int>(action);
  return i >= 0 && i < kHistoryActions ? kActionNames[i] : "unknown";
}

void MemoryHistory::Enable(size_t max_entries, int stack_frames) {
  MutexLock lock(&mu_);
  max_entries_ = std::max<size_t>(max_entries, 1);
  if (events_.size() > max_entries_) {
    // Keep the newest max_entries_ in order.
    std::rotate(events_.begin(), events_.begin() + next_, events_.end());
    dropped_ += events_.size() - max_entries_;
    events_.erase(events_.begin(), events_.end() - max_entries_);
    next_ = 0;
  }
  if (tags_.empty()) {
    tags_.push_back("");
    stacks_.emplace_back();
  }
  if (start_ns_.load(std::memory_order_relaxed) == 0) {
    start_epoch_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    start_ns_.store(SteadyNs(), std::memory_order_relaxed);
  }
  stack_frames_.store(std::clamp(stack_frames, 0, kMaxStackFrames), std::memory_order_relaxed);
  enabled_.store(true, std::memory_order_relaxed);
}

int64_t MemoryHistory::NowNs() const {
  return SteadyNs() - start_ns_.load(std::memory_order_relaxed);
}

uint32_t MemoryHistory::InternTagLocked(absl::string_view tag) {
  if (tag.empty()) return 0;
  if (auto it = tag_ids_.find(tag); it != tag_ids_.end()) return it->second;
  const auto id = static_cast<uint32_t>(tags_.size());
  tags_.emplace_back(tag);
  tag_ids_.emplace(std::string(tag), id);
  return id;
}

void MemoryHistory::Record(const HistoryRecord& r) {
  if (!enabled()) return;
  HistoryEvent e;
  e.time_ns = NowNs();
  e.addr = r.addr;
  e.size = r.size;
  e.stream = r.stream;
  e.device_free = r.device_free;
  e.stack = r.stack;
  e.thread = ThreadId();
  e.library = r.library;
  e.device = static_cast<int16_t>(r.device);
  e.peer = static_cast<int16_t>(r.peer);
  e.action = r.action;
  MutexLock lock(&mu_);
  e.tag = InternTagLocked(r.tag);
  if (events_.size() < max_entries_) {
    events_.push_back(e);
    return;
  }
  events_[next_] = e;
  next_ = (next_ + 1) % events_.size();
  ++dropped_;
}

uint32_t MemoryHistory::InternStack(absl::Span<void* const> frames) {
  if (frames.empty()) return 0;
  std::vector<uintptr_t> key(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) key[i] = reinterpret_cast<uintptr_t>(frames[i]);
  MutexLock lock(&mu_);
  if (stacks_.empty()) stacks_.emplace_back();
  if (auto it = stack_ids_.find(key); it != stack_ids_.end()) return it->second;
  const auto id = static_cast<uint32_t>(stacks_.size());
  stacks_.push_back(key);
  stack_ids_.emplace(std::move(key), id);
  return id;
}

MemoryHistory::Contents MemoryHistory::Copy() const {
  Contents c;
  MutexLock lock(&mu_);
  c.events.reserve(events_.size());
  c.events.insert(c.events.end(), events_.begin() + next_, events_.end());
  c.events.insert(c.events.end(), events_.begin(), events_.begin() + next_);
  c.tags = tags_.empty() ? std::vector<std::string>{""} : tags_;
  c.stacks = stacks_.empty() ? std::vector<std::vector<uintptr_t>>(1) : stacks_;
  c.dropped = dropped_;
  c.start_epoch_us = start_epoch_us_;
  return c;
}

void MemoryHistory::AfterForkChild() { new (&mu_) Mutex; }

}  // namespace vmmshim

#include "core/report/memory_snapshot.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/safe_file.h"
#include "core/base/version.h"
#include "core/report/pickle_writer.h"

namespace vmmshim {
namespace {

struct Frame {
  std::string filename, name;
  int64_t line = 0;
};

// One return address as a frame: the object's path, the symbol (demangled)
// or the address, and the offset from the symbol as the line.
Frame Symbolize(uintptr_t pc) {
  Frame f;
  Dl_info info{};
  // The return address points after the call; pc - 1 is inside it.
  if (dladdr(reinterpret_cast<void*>(pc - 1), &info) == 0) {
    f.filename = "??";
    f.name = absl::StrFormat("%#x", pc);
    return f;
  }
  f.filename = info.dli_fname != nullptr ? info.dli_fname : "??";
  if (info.dli_sname != nullptr) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    f.name = status == 0 && demangled != nullptr ? demangled : info.dli_sname;
    std::free(demangled);
    f.line = static_cast<int64_t>(pc - reinterpret_cast<uintptr_t>(info.dli_saddr));
  } else {
    f.name = absl::StrFormat("%#x", pc - reinterpret_cast<uintptr_t>(info.dli_fbase));
  }
  return f;
}

class SnapshotBuilder {
 public:
  explicit SnapshotBuilder(const SnapshotSources& s) : s_(s) {
    if (s.libraries != nullptr) libraries_ = s.libraries->Names();
    if (libraries_.empty()) libraries_.push_back("unknown");
    if (s.history != nullptr) history_ = s.history->Copy();
    now_us_ = history_.start_epoch_us;
    if (s.history != nullptr && history_.start_epoch_us != 0) {
      now_us_ += s.history->NowNs() / 1000;
    } else {
      now_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
    }
  }

  std::string Build() {
    const std::vector<SegmentInfo> segments = s_.control->Segments();
    int devices = 1;
    for (const SegmentInfo& seg : segments) devices = std::max(devices, seg.device + 1);
    for (const HistoryEvent& e : history_.events) devices = std::max(devices, e.device + 1);

    w_.BeginDict();
    w_.Key("segments");
    w_.BeginList();
    for (const SegmentInfo& seg : segments) {
      if (!seg.paused) Segment(seg);
    }
    w_.EndList();

    w_.Key("device_traces");
    w_.BeginList();
    for (int d = 0; d < devices; ++d) DeviceTrace(d);
    w_.EndList();

    w_.Key("vmmshim");
    w_.BeginDict();
    w_.IntEntry("format", kSnapshotFormat);
    w_.StringEntry("version", VMMSHIM_VERSION);
    w_.IntEntry("pid", s_.pid);
    w_.BoolEntry("history", s_.history != nullptr && s_.history->enabled());
    w_.UIntEntry("dropped_events", history_.dropped);
    w_.Key("libraries");
    w_.BeginList();
    for (const std::string& name : libraries_) w_.String(name);
    w_.EndList();
    w_.Key("events");
    w_.BeginList();
    for (const HistoryEvent& e : history_.events) {
      if (!IsMemoryVizAction(e.action)) OwnEvent(e);
    }
    w_.EndList();
    w_.Key("paused_segments");
    w_.BeginList();
    for (const SegmentInfo& seg : segments) {
      if (seg.paused) Segment(seg);
    }
    w_.EndList();
    w_.EndDict();

    w_.EndDict();
    return w_.Finish();
  }

 private:
  const std::string& Library(uint16_t id) const {
    return id < libraries_.size() ? libraries_[id] : libraries_[0];
  }
  const std::string& Tag(uint32_t id) const {
    static const std::string kNone;
    return id < history_.tags.size() ? history_.tags[id] : kNone;
  }

  void LibraryFrames(uint16_t origin) {
    w_.BeginList();
    w_.BeginDict();
    w_.StringEntry("filename", Library(origin));
    w_.IntEntry("line", 0);
    w_.StringEntry("name", "(caller library)");
    w_.EndDict();
    w_.EndList();
  }

  void StackFrames(uint32_t stack, uint16_t origin) {
    if (stack == 0 || stack >= history_.stacks.size()) {
      LibraryFrames(origin);
      return;
    }
    w_.BeginList();
    for (uintptr_t pc : history_.stacks[stack]) {
      auto it = symbols_.find(pc);
      if (it == symbols_.end()) it = symbols_.emplace(pc, Symbolize(pc)).first;
      w_.BeginDict();
      w_.StringEntry("filename", it->second.filename);
      w_.IntEntry("line", it->second.line);
      w_.StringEntry("name", it->second.name);
      w_.EndDict();
    }
    w_.EndList();
  }

  void Segment(const SegmentInfo& seg) {
    uint64_t allocated = 0, requested = 0;
    for (const SegmentPart& p : seg.parts) {
      if (!p.live) continue;
      allocated += p.size;
      requested += p.requested;
    }
    w_.BeginDict();
    w_.IntEntry("device", seg.device);
    w_.UIntEntry("address", seg.address);
    w_.UIntEntry("total_size", seg.size);
    w_.UIntEntry("allocated_size", allocated);
    w_.UIntEntry("active_size", allocated);
    w_.UIntEntry("requested_size", requested);
    w_.IntEntry("stream", 0);
    w_.StringEntry("segment_type", seg.packed ? "small" : "large");
    w_.Key("segment_pool_id");
    w_.Pair(0, 0);
    w_.BoolEntry("is_expandable", false);
    w_.Key("frames");
    w_.BeginList();
    w_.EndList();
    w_.StringEntry("tag", seg.tag);
    w_.BoolEntry("stream_ordered", seg.stream_ordered);
    w_.Key("blocks");
    w_.BeginList();
    for (const SegmentPart& p : seg.parts) {
      w_.BeginDict();
      w_.UIntEntry("address", seg.address + p.offset);
      w_.UIntEntry("size", p.size);
      w_.UIntEntry("requested_size", p.live ? p.requested : 0);
      w_.StringEntry("state", p.live ? "active_allocated" : "inactive");
      w_.Key("frames");
      if (p.live) {
        LibraryFrames(p.origin);
      } else {
        w_.BeginList();
        w_.EndList();
      }
      if (p.live) {
        w_.StringEntry("library", Library(p.origin));
      }
      w_.EndDict();
    }
    w_.EndList();
    w_.EndDict();
  }

  void CommonFields(const HistoryEvent& e) {
    w_.StringEntry("action", HistoryActionName(e.action));
    w_.IntEntry("time_us", history_.start_epoch_us + e.time_ns / 1000);
    w_.StringEntry("tag", Tag(e.tag));
    w_.IntEntry("thread", e.thread);
  }

  void DeviceTrace(int device) {
    w_.BeginList();
    for (const HistoryEvent& e : history_.events) {
      if (e.device != device || !IsMemoryVizAction(e.action)) continue;
      w_.BeginDict();
      CommonFields(e);
      w_.UIntEntry("addr", e.addr);
      w_.UIntEntry("size", e.size);
      w_.UIntEntry("stream", e.stream);
      w_.StringEntry("category", e.tag == 0 ? "unknown" : Tag(e.tag));
      w_.StringEntry("library", Library(e.library));
      w_.Key("frames");
      StackFrames(e.stack, e.library);
      if (e.action == HistoryAction::kOom) {
        w_.UIntEntry("device_free", e.device_free);
      }
      w_.EndDict();
    }
    // The snapshot itself, which also puts "unknown" among the categories.
    w_.BeginDict();
    w_.StringEntry("action", "snapshot");
    w_.IntEntry("time_us", now_us_);
    w_.IntEntry("addr", 0);
    w_.IntEntry("size", 0);
    w_.IntEntry("stream", 0);
    w_.StringEntry("category", "unknown");
    w_.Key("frames");
    w_.BeginList();
    w_.EndList();
    w_.EndDict();
    w_.EndList();
  }

  void OwnEvent(const HistoryEvent& e) {
    w_.BeginDict();
    CommonFields(e);
    w_.IntEntry("device", e.device);
    w_.IntEntry("peer", e.peer);
    w_.UIntEntry("addr", e.addr);
    w_.UIntEntry("size", e.size);
    w_.EndDict();
  }

  const SnapshotSources& s_;
  std::vector<std::string> libraries_;
  MemoryHistory::Contents history_;
  int64_t now_us_ = 0;
  std::map<uintptr_t, Frame> symbols_;
  PickleWriter w_;
};

}  // namespace

std::string MemorySnapshotPickle(const SnapshotSources& sources) {
  return SnapshotBuilder(sources).Build();
}

absl::Status WriteMemorySnapshot(const SnapshotSources& sources, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("memory snapshot: no path given");
  // Note [Replacing a file safely] (core/base/safe_file.h).
  const absl::Status written =
      ReplaceFile(path, MemorySnapshotPickle(sources), absl::StrCat("memory snapshot not written to '", path, "'"));
  return written;
}

}  // namespace vmmshim

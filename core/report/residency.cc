#include "core/report/residency.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "core/report/residency_devices.h"
#include "core/sync/capture.h"
#include "nlohmann/json.hpp"

namespace vmmshim {
namespace {

// What the driver says about `device`, each figure nullopt when unknown.
struct DriverFigures {
  std::optional<uint64_t> total, free, graph, pool;
};

DriverFigures AskDriver(const DriverApi& d, int device) {
  DriverFigures f;
  // Only in a primary context that is active already: retaining an
  // inactive one would create a context (hundreds of MiB) to answer.
  unsigned flags = 0;
  int active = 0;
  CUcontext ctx = nullptr;
  if (d.cuDevicePrimaryCtxGetState != nullptr && d.cuDevicePrimaryCtxRetain != nullptr &&
      d.cuDevicePrimaryCtxRelease_v2 != nullptr &&
      d.cuDevicePrimaryCtxGetState(device, &flags, &active) == CUDA_SUCCESS && active != 0 &&
      d.cuDevicePrimaryCtxRetain(&ctx, device) == CUDA_SUCCESS) {
    if (d.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
      size_t free = 0, total = 0;
      if (d.cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS) {
        f.free = free;
        f.total = total;
      }
      CUcontext popped = nullptr;
      d.cuCtxPopCurrent_v2(&popped);
    }
    d.cuDevicePrimaryCtxRelease_v2(device);
  }
  if (d.cuDeviceGetGraphMemAttribute != nullptr) {
    cuuint64_t v = 0;
    if (d.cuDeviceGetGraphMemAttribute(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v) ==
        CUDA_SUCCESS) {
      f.graph = v;
    }
  }
  // The real driver's answer: the shim's part is not in it (the table is
  // the driver's, not the hooks').
  CUmemoryPool pool = nullptr;
  if (d.cuDeviceGetDefaultMemPool != nullptr && d.cuMemPoolGetAttribute != nullptr &&
      d.cuDeviceGetDefaultMemPool(&pool, device) == CUDA_SUCCESS) {
    cuuint64_t v = 0;
    if (d.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS) {
      f.pool = v;
    }
  }
  return f;
}

nlohmann::json OrNull(const std::optional<uint64_t>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json ResidencyDevices(const MemoryControl& control, const DriverApi* driver) {
  nlohmann::json devices = nlohmann::json::array();
  for (const DeviceResidency& r : control.Residency()) {
    nlohmann::json tags = nlohmann::json::object();
    for (const auto& [tag, t] : r.tags) {
      tags[tag] = {{"resident_bytes", t.resident_bytes},
                   {"paused_bytes", t.paused_bytes},
                   {"paused_faulting_bytes", t.paused_faulting_bytes}};
    }
    const uint64_t shim = r.resident_bytes();
    DriverFigures f;
    if (driver != nullptr) {
      // Note [The shim's own threads and captures] (core/sync/capture.h).
      ScopedRelaxedCaptureMode relaxed(*driver);
      f = AskDriver(*driver, r.device);
    }
    std::optional<uint64_t> used, rest;
    if (f.total && f.free) {
      used = *f.total - *f.free;
      // What no category above explains; clamped at 0 (the figures are not
      // taken at one instant).
      const uint64_t known = shim + r.passed_through_bytes + r.other_vmm_bytes() +
                             f.graph.value_or(0) + f.pool.value_or(0);
      rest = *used > known ? *used - known : 0;
    }
    devices.push_back(
        {{"device", r.device},
         {"device_total_bytes", OrNull(f.total)},
         {"device_free_bytes", OrNull(f.free)},
         {"device_used_bytes", OrNull(used)},
         {"shim",
          {{"resident_bytes", shim},
           {"by_tag", tags},
           {"cached_bytes", r.cached_bytes},
           {"release_pending_bytes", r.orphan_bytes},
           {"stream_ordered_cached_bytes", r.stream_ordered_cached_bytes}}},
         {"passed_through_bytes", r.passed_through_bytes},
         {"graph_memory_bytes", OrNull(f.graph)},
         {"driver_default_pool_bytes", OrNull(f.pool)},
         {"other_libraries_vmm",
          {{"bytes", r.other_vmm_bytes()},
           {"by_tag", r.other_vmm_by_tag},
           {"paused_by_tag", r.other_vmm_paused_by_tag},
           {"paused_faulting_bytes", r.other_vmm_paused_faulting_bytes},
           {"left_alone",
            {{"exported_bytes", r.other_vmm_exported_bytes},
             {"exported_reason", "exported to another process, which may map it"},
             {"imported_bytes", r.other_vmm_imported_bytes},
             {"imported_reason", "imported: another process owns it"},
             {"unmapped_bytes", r.other_vmm_unmapped_bytes},
             {"unmapped_reason", "mapped nowhere: its contents cannot be reached to be kept"}}}}},
         {"unattributed_bytes", OrNull(rest)}});
  }
  return devices;
}

nlohmann::json HostMemoryForPausesJson(const MemoryControl& control) {
  nlohmann::json host = nlohmann::json::array();
  for (const auto& [device, s] : control.HostMemoryForPauses()) {
    host.push_back({{"device", device},
                    {"kept_bytes", s.kept_bytes},
                    {"in_use_bytes", s.in_use_bytes},
                    {"scratch_bytes", s.scratch_bytes},
                    {"made_bytes", s.made_bytes},
                    {"make_seconds", s.make_seconds},
                    {"reused_bytes", s.reused_bytes},
                    {"released_bytes", s.trimmed_bytes},
                    {"made_in_background_bytes", s.background_bytes},
                    {"queued_bytes", s.queued_bytes},
                    {"sized_by", s.limited_by.empty() ? "what the process paused last"
                                                      : "cut by " + s.limited_by}});
  }
  return host;
}

std::string ResidencyJson(const MemoryControl& control, const DriverApi* driver) {
  const PinnedPool::Stats pool = control.PinnedPoolNow();
  return nlohmann::json{{"devices", ResidencyDevices(control, driver)},
                        {"pinned_pool",
                         {{"bytes", pool.bytes},
                          {"free_bytes", pool.free_bytes},
                          {"pinned_bytes", pool.pinned_bytes},
                          {"fill_seconds", pool.fill_seconds}}},
                        {"host_memory_for_pauses", HostMemoryForPausesJson(control)}}
      .dump(2);
}

std::string ResidencySummary(const MemoryControl& control) {
  std::string out = "resident:";
  for (const DeviceResidency& r : control.Residency()) {
    absl::StrAppend(&out, " device ", r.device, ": ", r.resident_bytes(), " bytes (");
    const char* sep = "";
    for (const auto& [tag, t] : r.tags) {
      absl::StrAppend(&out, sep, tag.empty() ? std::string("untagged")
                                             : absl::StrCat("tag '", tag, "'"),
                      " ", t.resident_bytes);
      if (t.paused_bytes > 0) absl::StrAppend(&out, " (paused ", t.paused_bytes, ")");
      sep = ", ";
    }
    absl::StrAppend(&out, sep, "cache ", r.cached_bytes, "; passed through ",
                    r.passed_through_bytes, "; other libraries' VMM ", r.other_vmm_bytes(), ")");
  }
  return out;
}

}  // namespace vmmshim

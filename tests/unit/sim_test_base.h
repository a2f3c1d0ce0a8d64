// What the unit tests on the simulated driver share: a fresh simulation,
// current contexts, and allocations that must be served.
#ifndef VMMSHIM_TESTS_UNIT_SIM_TEST_BASE_H_
#define VMMSHIM_TESTS_UNIT_SIM_TEST_BASE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/shim_core.h"
#include "core/heap/tag_selection.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"

namespace vmmshim {

inline constexpr size_t kTestMiB = size_t{1} << 20;

// The peer policies the multi-GPU tests compare, by name: "all", "none",
// "min-size 1MiB", and "rules: ring" (each device shares with its two
// neighbours on a ring of `gpus`).
inline PeerPolicy TestPeerPolicy(const std::string& name, int gpus) {
  PeerPolicy p;
  if (name == "all") p.kind = PeerPolicy::Kind::kAll;
  if (name == "none") p.kind = PeerPolicy::Kind::kNone;
  if (name == "min-size 1MiB") {
    p.kind = PeerPolicy::Kind::kMinSize;
    p.min_bytes = kTestMiB;
  }
  if (name == "rules: ring") {
    p.kind = PeerPolicy::Kind::kRules;
    p.rules_file = "ring";
    for (int d = 0; d < gpus; ++d) {
      PeerRule r;
      r.owner = d;
      r.peers = {(d + 1) % gpus, (d + gpus - 1) % gpus};
      r.allow = true;
      p.rules.push_back(r);
    }
  }
  return p;
}

class SimTest : public ::testing::Test {
 protected:
  // Starts the simulated driver over: `devices` GPUs of `memory` bytes each,
  // cuInit done, api_ filled.
  void StartSim(int devices = 2, size_t memory = 1024 * kTestMiB) {
    sim::SimOptions o;
    o.device_count = devices;
    o.memory_per_device = memory;
    sim::Reset(o);
    ASSERT_EQ(sim::cuInit(0), CUDA_SUCCESS);
    api_ = sim::Api();
  }
  // Retains the primary context of `device` and makes it current.
  CUcontext MakeCurrent(int device) {
    CUcontext ctx = nullptr;
    EXPECT_EQ(sim::cuDevicePrimaryCtxRetain(&ctx, device), CUDA_SUCCESS);
    EXPECT_EQ(sim::cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    return ctx;
  }
  // Options under which an access to paused memory faults
  // (VMMSHIM_PAUSED_ACCESS=fault): the tests of the copies' own paths
  // (staging ring, pinned pool, page-locked copies) and of exact driver call
  // sequences, which host-mapped views would change.
  static AllocatorOptions FaultingPauses() {
    AllocatorOptions o;
    o.paused_memory_addressable = false;
    return o;
  }
  // Nothing left behind in the simulated driver: no device or host handle,
  // mapping, reservation or page-locked host allocation.
  static void ExpectNothingLeft() {
    const sim::Usage u = sim::GetUsage();
    EXPECT_EQ(u.handles, 0u);
    EXPECT_EQ(u.host_handles, 0u);
    EXPECT_EQ(u.mappings, 0u);
    EXPECT_EQ(u.reservations, 0u);
    EXPECT_EQ(sim::LiveHostAllocations(), 0u);
  }
  // An allocation that must be served from VMM.
  static CUdeviceptr MustAllocate(Allocator& a, size_t bytes) {
    absl::StatusOr<Allocator::Allocation> r = a.Allocate(bytes);
    EXPECT_TRUE(r.ok() && r->served) << r.status();
    return r.ok() ? r->ptr : 0;
  }

  // Writes a byte pattern of `seed` into device 0's memory at `p`;
  // HoldsPattern says whether it is still there (false also when the
  // memory cannot be read: unmapped, paused).
  static void Fill(CUdeviceptr p, size_t bytes, int seed) {
    std::vector<unsigned char> v(bytes);
    for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(i * 13 + seed);
    ASSERT_EQ(sim::DeviceWrite(0, p, v.data(), bytes), CUDA_SUCCESS);
  }
  static bool Holds(CUdeviceptr p, size_t bytes, int seed) {
    std::vector<unsigned char> v(bytes);
    if (sim::DeviceRead(0, v.data(), p, bytes) != CUDA_SUCCESS) return false;
    for (size_t i = 0; i < bytes; ++i) {
      if (v[i] != static_cast<unsigned char>(i * 13 + seed)) return false;
    }
    return true;
  }
  // cuMemGetInfo's free bytes of the current context's device.
  static size_t FreeMemory() {
    size_t free = 0, total = 0;
    EXPECT_EQ(sim::cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
    return free;
  }

  // The driver calls a pause with contents and its resume make
  // (core/heap/pause.h), for fault injection.
  static std::vector<const char*> PauseDriverCalls() {
    return {"cuCtxSynchronize", "cuMemHostRegister_v2", "cuMemcpyDtoH_v2", "cuMemUnmap",
            "cuMemRelease", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemcpyHtoD_v2",
            "cuMemcpyDtoDAsync_v2", "cuMemAddressReserve"};
  }

  // Fault injection in a pause with contents of `selection` and its resume:
  // for each of `entries`, each of its first `calls` calls, failing at the
  // pause or at the resume, on a simulation started over (SetUp), with
  // `prepare(shim)` making and filling memory first. Then, with the
  // driver working again, a resume must succeed, nothing may stay paused,
  // `check(shim, what)` must find the contents and free the memory, and
  // nothing may be left: no handle, mapping or page-locked host allocation.
  // Returns the number of runs.
  template <typename Prepare, typename Check>
  int RunPauseFaults(const std::vector<const char*>& entries, int calls,
                     const TagSelection& selection, Prepare prepare, Check check) {
    int runs = 0;
    for (const char* entry : entries) {
      for (int nth = 1; nth <= calls; ++nth) {
        for (bool at_resume : {false, true}) {
          SetUp();
          std::string what = absl::StrCat(entry, " call ", nth, at_resume ? " at the resume"
                                                                          : " at the pause");
          {
            ShimCore shim(api_);
            prepare(shim);
            if (!at_resume) sim::FailCall(entry, nth, CUDA_ERROR_UNKNOWN);
            absl::StatusOr<size_t> paused = shim.pause().Pause(selection, true);
            if (at_resume) sim::FailCall(entry, nth, CUDA_ERROR_UNKNOWN);
            absl::StatusOr<size_t> resumed = shim.pause().Resume(selection);
            sim::ClearFailures();
            absl::StrAppend(&what, " (pause: ", paused.status().ToString(),
                            "; resume: ", resumed.status().ToString(), ")");
            EXPECT_TRUE(shim.pause().Resume(selection).ok()) << what;
            EXPECT_EQ(shim.control().GetStats().paused_bytes, 0u) << what;
            check(shim, what);
            shim.control().Trim();
            EXPECT_TRUE(shim.ReleaseAll().ok()) << what;
          }
          const sim::Usage u = sim::GetUsage();
          EXPECT_EQ(u.handles, 0u) << what;
          EXPECT_EQ(u.host_handles, 0u) << what;
          EXPECT_EQ(u.mappings, 0u) << what;
          EXPECT_EQ(sim::LiveHostAllocations(), 0u) << what;
          ++runs;
        }
      }
    }
    return runs;
  }

  DriverApi api_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_TESTS_UNIT_SIM_TEST_BASE_H_

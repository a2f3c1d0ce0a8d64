// What the unit tests on the simulated driver share: a fresh simulation,
// current contexts, and allocations that must be served.
#ifndef VMMSHIM_TESTS_UNIT_SIM_TEST_BASE_H_
#define VMMSHIM_TESTS_UNIT_SIM_TEST_BASE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "core/allocator.h"
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

  DriverApi api_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_TESTS_UNIT_SIM_TEST_BASE_H_

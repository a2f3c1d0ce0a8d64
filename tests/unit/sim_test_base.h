// What the unit tests on the simulated driver share: a fresh simulation,
// current contexts, and allocations that must be served.
#ifndef VMMSHIM_TESTS_UNIT_SIM_TEST_BASE_H_
#define VMMSHIM_TESTS_UNIT_SIM_TEST_BASE_H_

#include <cstddef>

#include "core/allocator.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"

namespace vmmshim {

inline constexpr size_t kTestMiB = size_t{1} << 20;

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

  DriverApi api_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_TESTS_UNIT_SIM_TEST_BASE_H_

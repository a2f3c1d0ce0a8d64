// core/lifecycle/stack_reservation.h on the simulated driver: the stack limit
// of every active primary context lowered for a sleep and put back exactly at
// the wake, all or nothing, and kept for the next wake when putting it back
// fails.
#include "core/lifecycle/stack_reservation.h"

#include "core/driver/cu_status.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_driver.h"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

class StackReservationTest : public SimTest {
 protected:
  void SetUp() override { StartSim(/*devices=*/3); }
  // Retains device's primary context, makes it current and sets its limit.
  CUcontext ActiveWithStack(int device, size_t bytes) {
    CUcontext ctx = MakeCurrent(device);
    EXPECT_EQ(sim::cuCtxSetLimit(CU_LIMIT_STACK_SIZE, bytes), CUDA_SUCCESS);
    return ctx;
  }
};

TEST_F(StackReservationTest, LowersEveryActivePrimaryContextAndPutsBackTheExactLimit) {
  ActiveWithStack(0, 4096);
  CUcontext current = ActiveWithStack(1, sim::kSimDefaultStackBytes);
  // Device 2's primary context is inactive: nothing of it is retained.
  StackReservation stack(api_);
  int lowered = -1;
  ASSERT_TRUE(stack.Release(&lowered).ok());
  EXPECT_EQ(lowered, 2);
  EXPECT_EQ(stack.lowered(), 2);
  EXPECT_EQ(sim::PrimaryStackLimit(0), 0u);
  EXPECT_EQ(sim::PrimaryStackLimit(1), 0u);
  unsigned int flags = 0;
  int active = -1;
  ASSERT_EQ(sim::cuDevicePrimaryCtxGetState(2, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 0);
  CUcontext now = nullptr;
  ASSERT_EQ(sim::cuCtxGetCurrent(&now), CUDA_SUCCESS);
  EXPECT_EQ(now, current);  // the caller's context is current again

  int restored = -1;
  ASSERT_TRUE(stack.Restore(&restored).ok());
  EXPECT_EQ(restored, 2);
  EXPECT_EQ(stack.lowered(), 0);
  EXPECT_EQ(sim::PrimaryStackLimit(0), 4096u);
  EXPECT_EQ(sim::PrimaryStackLimit(1), sim::kSimDefaultStackBytes);
  ASSERT_TRUE(stack.Restore(&restored).ok());  // nothing left: no driver call
  EXPECT_EQ(restored, 0);
}

TEST_F(StackReservationTest, ASecondReleaseKeepsTheFirstRecordedLimit) {
  ActiveWithStack(0, 2048);
  StackReservation stack(api_);
  ASSERT_TRUE(stack.Release().ok());
  int lowered = -1;
  ASSERT_TRUE(stack.Release(&lowered).ok());
  EXPECT_EQ(lowered, 0);
  ASSERT_TRUE(stack.Restore().ok());
  EXPECT_EQ(sim::PrimaryStackLimit(0), 2048u);
}

TEST_F(StackReservationTest, AFailedReleasePutsBackWhatItLowered) {
  ActiveWithStack(0, 4096);
  ActiveWithStack(1, 8192);
  // Device 0's lowering succeeds, device 1's fails.
  sim::FailCall("cuCtxSetLimit", 2, CUDA_ERROR_OUT_OF_MEMORY);
  StackReservation stack(api_);
  absl::Status released = stack.Release();
  EXPECT_EQ(ToCuResult(released), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(released.message().find("cuCtxSetLimit"), absl::string_view::npos);
  EXPECT_EQ(stack.lowered(), 0);
  EXPECT_EQ(sim::PrimaryStackLimit(0), 4096u);
  EXPECT_EQ(sim::PrimaryStackLimit(1), 8192u);
}

TEST_F(StackReservationTest, AFailedRestoreIsTriedAgainByTheNext) {
  ActiveWithStack(0, 4096);
  StackReservation stack(api_);
  ASSERT_TRUE(stack.Release().ok());
  sim::FailCall("cuCtxSetLimit", 1, CUDA_ERROR_OUT_OF_MEMORY);  // a GPU full at the wake
  int restored = -1;
  EXPECT_EQ(ToCuResult(stack.Restore(&restored)), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(restored, 0);
  EXPECT_EQ(stack.lowered(), 1);
  EXPECT_EQ(sim::PrimaryStackLimit(0), 0u);
  ASSERT_TRUE(stack.Restore(&restored).ok());
  EXPECT_EQ(restored, 1);
  EXPECT_EQ(sim::PrimaryStackLimit(0), 4096u);
}

TEST_F(StackReservationTest, ADriverWithoutTheLimitCallsChangesNothing) {
  ActiveWithStack(0, 4096);
  api_.cuCtxSetLimit = nullptr;
  StackReservation stack(api_);
  int lowered = -1;
  ASSERT_TRUE(stack.Release(&lowered).ok());
  EXPECT_EQ(lowered, 0);
  EXPECT_EQ(sim::PrimaryStackLimit(0), 4096u);
}

}  // namespace
}  // namespace vmmshim

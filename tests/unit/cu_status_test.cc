#include "core/driver/cu_status.h"

#include "gtest/gtest.h"

namespace vmmshim {
namespace {

TEST(CuStatusTest, RoundTripsTheExactCode) {
  EXPECT_TRUE(DriverError(CUDA_SUCCESS, "x").ok());
  for (CUresult r : {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_VALUE,
                     CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_ILLEGAL_ADDRESS,
                     static_cast<CUresult>(999)}) {
    absl::Status s = DriverError(r, "cuMemCreate");
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(ToCuResult(s), r);
    EXPECT_NE(s.message().find("cuMemCreate"), absl::string_view::npos);
  }
  EXPECT_EQ(ToCuResult(absl::InvalidArgumentError("x")), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(ToCuResult(absl::InternalError("x")), CUDA_ERROR_UNKNOWN);
}

TEST(CuStatusTest, StickyErrorsAreContextLoss) {
  for (CUresult r : {CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_ASSERT,
                     CUDA_ERROR_MISALIGNED_ADDRESS, CUDA_ERROR_ILLEGAL_INSTRUCTION}) {
    EXPECT_TRUE(IsContextLost(r)) << r;
  }
  for (CUresult r : {CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_VALUE,
                     CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_NOT_SUPPORTED}) {
    EXPECT_FALSE(IsContextLost(r)) << r;
  }
  absl::Status s = Reworded(DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, "cuMemCreate"), "in words");
  EXPECT_EQ(s.message(), "in words");
  EXPECT_EQ(ToCuResult(s), CUDA_ERROR_ILLEGAL_ADDRESS);
}

}  // namespace
}  // namespace vmmshim

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

}  // namespace
}  // namespace vmmshim

#include "core/heap/create_prop.h"

#include "core/base/log.h"
#include "core/driver/cu_status.h"

namespace vmmshim {

bool CreateProp::DropCompressionAfter(const CUmemAllocationProp& asked,
                                      const absl::Status& failure) {
  if (ToCuResult(failure) == CUDA_ERROR_OUT_OF_MEMORY ||
      asked.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_NONE) {
    return false;
  }
  Log().warn("device {}: compressible cuMemCreate failed ({}); falling back to uncompressed "
             "memory",
             device_, failure.ToString());
  prop_.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;
  state_ = CompressionState::kNotGranted;
  checked_ = true;
  return true;
}

void CreateProp::CheckMade(const DriverApi& driver, const CUmemAllocationProp& asked,
                           CUmemGenericAllocationHandle handle) {
  if (asked.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_NONE || checked_) return;
  checked_ = true;
  CUmemAllocationProp got = {};
  CUresult r = driver.cuMemGetAllocationPropertiesFromHandle != nullptr
                   ? driver.cuMemGetAllocationPropertiesFromHandle(&got, handle)
                   : CUDA_ERROR_NOT_SUPPORTED;
  if (r == CUDA_SUCCESS && got.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_GENERIC) {
    state_ = CompressionState::kGranted;
    Log().info("device {}: generic compression granted (cuMemGetAllocationPropertiesFromHandle)",
               device_);
    return;
  }
  state_ = CompressionState::kNotGranted;
  prop_.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;
  Log().warn("device {}: compression requested but not granted ({}); later memory is made "
             "without it",
             device_, r == CUDA_SUCCESS ? "the handle reports no compression" : CuResultName(r));
}

}  // namespace vmmshim

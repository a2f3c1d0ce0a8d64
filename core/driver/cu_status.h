// Carrying a CUresult inside absl::Status.
//
// core/ reports errors as absl::Status. When an error must reach the
// application as a driver return code (interpose/ translates every status to
// a CUresult), the exact CUresult travels as a payload, so that the
// application sees what the real driver would have returned (for example
// CUDA_ERROR_OUT_OF_MEMORY from cuMemCreate, not a generic error).
#ifndef VMMSHIM_CORE_DRIVER_CU_STATUS_H_
#define VMMSHIM_CORE_DRIVER_CU_STATUS_H_

#include <cuda.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace vmmshim {

// A status for `result` returned by driver entry point `call`.
// CUDA_SUCCESS gives OkStatus().
absl::Status DriverError(CUresult result, absl::string_view call);

// The CUresult carried by `status`: its payload when present, otherwise a
// mapping of its code (kInvalidArgument -> CUDA_ERROR_INVALID_VALUE,
// kResourceExhausted -> CUDA_ERROR_OUT_OF_MEMORY, kNotFound ->
// CUDA_ERROR_NOT_FOUND, anything else -> CUDA_ERROR_UNKNOWN).
CUresult ToCuResult(const absl::Status& status);

// The one way core/ says "this pointer is not in memory the shim serves"
// (outside every VA reservation of the shim): the caller hands the call to
// the driver unchanged. Carries CUDA_ERROR_INVALID_VALUE, what the driver
// answers for a pointer it does not know, for callers that report it.
absl::Status NotShimMemory();
bool IsNotShimMemory(const absl::Status& status);

// The name of `result` ("CUDA_ERROR_OUT_OF_MEMORY") for the codes vmmshim
// produces or meets most often, or nullptr. Static strings.
const char* KnownCuResultName(CUresult result);

// KnownCuResultName, or "CUresult <number>".
std::string CuResultName(CUresult result);

// Whether `result` is a sticky error: after it, every call in the context
// fails the same way and the context cannot be used again; the process must
// end to recover (CUDA Programming Guide, "Error Checking"; the driver API's
// CUresult list: ILLEGAL_ADDRESS, LAUNCH_TIMEOUT, ASSERT, HARDWARE_STACK_ERROR,
// ILLEGAL_INSTRUCTION, MISALIGNED_ADDRESS, INVALID_ADDRESS_SPACE, INVALID_PC,
// LAUNCH_FAILED).
bool IsContextLost(CUresult result);

// `status` with `message` in place of its message; the code and the CUresult
// it carries stay.
absl::Status Reworded(const absl::Status& status, absl::string_view message);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_DRIVER_CU_STATUS_H_

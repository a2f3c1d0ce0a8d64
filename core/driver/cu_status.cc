#include "core/driver/cu_status.h"

#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace vmmshim {
namespace {

constexpr absl::string_view kPayloadUrl = "vmmshim/CUresult";
constexpr absl::string_view kNotShimUrl = "vmmshim/not-shim-memory";

absl::StatusCode CodeFor(CUresult result) {
  switch (result) {
    case CUDA_ERROR_INVALID_VALUE:
      return absl::StatusCode::kInvalidArgument;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NOT_INITIALIZED:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

const char* KnownCuResultName(CUresult result) {
  // Not the driver's cuGetErrorName: core/ must also name codes when the
  // driver is torn down (process exit).
  switch (result) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_LAUNCH_TIMEOUT: return "CUDA_ERROR_LAUNCH_TIMEOUT";
    case CUDA_ERROR_ASSERT: return "CUDA_ERROR_ASSERT";
    case CUDA_ERROR_HARDWARE_STACK_ERROR: return "CUDA_ERROR_HARDWARE_STACK_ERROR";
    case CUDA_ERROR_ILLEGAL_INSTRUCTION: return "CUDA_ERROR_ILLEGAL_INSTRUCTION";
    case CUDA_ERROR_MISALIGNED_ADDRESS: return "CUDA_ERROR_MISALIGNED_ADDRESS";
    case CUDA_ERROR_INVALID_ADDRESS_SPACE: return "CUDA_ERROR_INVALID_ADDRESS_SPACE";
    case CUDA_ERROR_INVALID_PC: return "CUDA_ERROR_INVALID_PC";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: return "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED";
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
    case CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: return "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED";
    default: return nullptr;
  }
}

std::string CuResultName(CUresult result) {
  const char* name = KnownCuResultName(result);
  return name != nullptr ? name : absl::StrCat("CUresult ", static_cast<int>(result));
}

bool IsContextLost(CUresult result) {
  switch (result) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
      return true;
    default:
      return false;
  }
}

absl::Status DriverError(CUresult result, absl::string_view call) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  absl::Status status(CodeFor(result),
                      absl::StrCat(call, " failed: ", CuResultName(result)));
  status.SetPayload(kPayloadUrl, absl::Cord(absl::StrCat(static_cast<int>(result))));
  return status;
}

absl::Status Reworded(const absl::Status& status, absl::string_view message) {
  absl::Status out(status.code(), message);
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

CUresult ToCuResult(const absl::Status& status) {
  if (status.ok()) return CUDA_SUCCESS;
  if (auto payload = status.GetPayload(kPayloadUrl)) {
    int value;
    if (absl::SimpleAtoi(std::string(*payload), &value)) return static_cast<CUresult>(value);
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return CUDA_ERROR_INVALID_VALUE;
    case absl::StatusCode::kResourceExhausted:
      return CUDA_ERROR_OUT_OF_MEMORY;
    case absl::StatusCode::kNotFound:
      return CUDA_ERROR_NOT_FOUND;
    default:
      return CUDA_ERROR_UNKNOWN;
  }
}

absl::Status NotShimMemory() {
  absl::Status status = DriverError(CUDA_ERROR_INVALID_VALUE, "not vmmshim memory");
  status.SetPayload(kNotShimUrl, absl::Cord("1"));
  return status;
}

bool IsNotShimMemory(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kNotShimUrl).has_value();
}

}  // namespace vmmshim

// The simulated driver as a shared library named libcuda.so.1, for
// end-to-end tests that preload libvmmshim.so into unmodified driver-API
// programs. It exports the simulated entry points under their driver names,
// the two resolvers (cuGetProcAddress with 4 arguments, cuGetProcAddress_v2
// with 5), and a few simcu* functions that let test programs read the
// simulation's counters. Linked with -Bsymbolic so that, like the real
// driver, its resolver answers with its own functions even when a preloaded
// library exports the same names.
//
// Environment: see sim::OptionsFromEnv; also SIMCUDA_FAIL=entry:nth:code[,..]
// to fail the nth call of an entry point.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/sim/sim_driver.h"

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

// cuda.h maps cuGetProcAddress to cuGetProcAddress_v2; the 4-argument
// cuGetProcAddress is a distinct exported function of the driver.
#undef cuGetProcAddress

namespace {

void ApplyEnvFailures() {
  const char* v = std::getenv("SIMCUDA_FAIL");
  if (v == nullptr) return;
  for (absl::string_view item : absl::StrSplit(v, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    int nth, code;
    if (parts.size() == 3 && absl::SimpleAtoi(parts[1], &nth) &&
        absl::SimpleAtoi(parts[2], &code)) {
      vmmshim::sim::FailCall(parts[0], nth, static_cast<CUresult>(code));
    }
  }
}

// False, after one message naming it, when a SIMCUDA_* variable is
// malformed: every entry point then fails with CUDA_ERROR_INVALID_VALUE, so
// that a typo is not run as some other configuration.
bool EnsureConfigured() {
  static std::once_flag once;
  static bool configured = false;
  std::call_once(once, [] {
    std::string error;
    vmmshim::sim::SimOptions options = vmmshim::sim::OptionsFromEnv(&error);
    if (!error.empty()) {
      std::fprintf(stderr,
                   "simcuda (the simulated libcuda.so.1): %s; every driver call fails with "
                   "CUDA_ERROR_INVALID_VALUE\n",
                   error.c_str());
      return;
    }
    vmmshim::sim::Reset(options);
    ApplyEnvFailures();
    configured = true;
  });
  return configured;
}

void* ExportLookup(const char* name);

}  // namespace

#define VMMSHIM_SIM_EXPORT(name, params, args) \
  SIM_EXPORT CUresult name params {            \
    if (!EnsureConfigured()) {                 \
      return CUDA_ERROR_INVALID_VALUE;         \
    }                                          \
    return vmmshim::sim::name args;            \
  }
VMMSHIM_SIM_ENTRY_POINTS(VMMSHIM_SIM_EXPORT)
#undef VMMSHIM_SIM_EXPORT

SIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                        cuuint64_t flags,
                                        CUdriverProcAddressQueryResult* status) {
  EnsureConfigured();
  return vmmshim::sim::GetProcAddress(symbol, pfn, version, flags, status, &ExportLookup);
}

SIM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                     cuuint64_t flags) {
  EnsureConfigured();
  return vmmshim::sim::GetProcAddress(symbol, pfn, version, flags, nullptr, &ExportLookup);
}

// Test hooks for programs run under the simulation.
SIM_EXPORT unsigned long long simcuCallCount(const char* entry) {
  EnsureConfigured();
  return vmmshim::sim::CallCount(entry);
}

SIM_EXPORT size_t simcuDeviceBytesInUse(int device) {
  EnsureConfigured();
  return vmmshim::sim::DeviceBytesInUse(device);
}

SIM_EXPORT size_t simcuLiveHandles() {
  EnsureConfigured();
  return vmmshim::sim::GetUsage().handles;
}

namespace {
void* ExportLookup(const char* name) {
#define VMMSHIM_SIM_MATCH(fn, params, args) \
  if (std::strcmp(name, #fn) == 0) return reinterpret_cast<void*>(&::fn);
  VMMSHIM_SIM_ENTRY_POINTS(VMMSHIM_SIM_MATCH)
#undef VMMSHIM_SIM_MATCH
  if (std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    return reinterpret_cast<void*>(&::cuGetProcAddress_v2);
  }
  if (std::strcmp(name, "cuGetProcAddress") == 0) {
    return reinterpret_cast<void*>(&::cuGetProcAddress);
  }
  return nullptr;
}
}  // namespace

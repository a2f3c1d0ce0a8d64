// The resolvers (cuGetProcAddress, cuGetProcAddress_v2) and HookFor, the
// routing table generated from interpose/hook_list.h and the gated entry
// points of core/driver/work_submission.h. The real resolver
// answers first; only an answer that is exactly the address of a hooked
// export is replaced (route by address identity, never by name prefix:
// docs/architecture.md, "Measured driver facts").
#include <cstring>

#include "core/base/log.h"
#include "core/driver/work_submission.h"
#include "interpose/hooks.h"
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Log;
using vmmshim::Runtime;

namespace {

bool Gated(const char* name) {
  for (const char* gated : vmmshim::kWorkSubmissionNames) {
    if (std::strcmp(gated, name) == 0) return true;
  }
  return false;
}

// The answer for the real resolver's `real_fn`: the hook of the same export,
// or `real_fn`. Logged at debug, one line per lookup, so that a run shows
// which entry points a program resolves and which of them the submission
// gate holds (tools/gpu/resolved-entry-points.py reads these lines).
void* Substitute(const Runtime& rt, const char* symbol, int cuda_version, cuuint64_t flags,
                 void* real_fn) {
  if (!rt.enabled()) {
    // Pass-through still answers the resolver self-lookup with the real
    // resolver, so later lookups bypass the shim entirely.
    return real_fn;
  }
  const char* name = rt.driver.NameOf(real_fn);
  void* hook = name != nullptr ? vmmshim::HookFor(name) : nullptr;
  Log().debug("resolved {} (cudaVersion {}, flags {:#x}) -> {}: {}",
              symbol != nullptr ? symbol : "?", cuda_version, flags,
              name != nullptr ? name : "?",
              hook == nullptr ? "driver" : Gated(name) ? "gated" : "hooked");
  return hook != nullptr ? hook : real_fn;
}

}  // namespace

VMMSHIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* symbol_status) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || rt->driver.cuGetProcAddress_v2 == nullptr) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  // The real resolver first, with the caller's arguments: its errors, NULL
  // answers and status pass through unchanged; only an answer that is
  // exactly the address of a hooked export is replaced.
  CUresult r = rt->driver.cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, symbol_status);
  if (r == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) {
    *pfn = Substitute(*rt, symbol, cuda_version, flags, *pfn);
  }
  return r;
}

VMMSHIM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                         cuuint64_t flags) {
  const Runtime* rt = GetRuntime();
  if (rt == nullptr || rt->driver.cuGetProcAddress == nullptr) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  CUresult r = rt->driver.cuGetProcAddress(symbol, pfn, cuda_version, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) {
    *pfn = Substitute(*rt, symbol, cuda_version, flags, *pfn);
  }
  return r;
}

namespace vmmshim {
namespace {

struct HookEntry {
  const char* name;  // the driver export whose ABI the hook implements
  void* hook;
};

// The gated hooks carry the driver's names, deprecated ones (cuLaunch,
// cuLaunchGrid, ...) included: taking their address is not a use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
const HookEntry kHooks[] = {
#define VMMSHIM_HOOK_ENTRY(name, pfn) {#name, reinterpret_cast<void*>(&::name)},
    VMMSHIM_HOOKED_DRIVER_EXPORTS(VMMSHIM_HOOK_ENTRY)
#undef VMMSHIM_HOOK_ENTRY
#define VMMSHIM_GATED_ENTRY(member, symbol, type, required) \
  {symbol, reinterpret_cast<void*>(&::member)},
    VMMSHIM_WORK_SUBMISSION_ENTRY_POINTS(VMMSHIM_GATED_ENTRY)
#undef VMMSHIM_GATED_ENTRY
};
#pragma GCC diagnostic pop

}  // namespace

void* HookFor(const char* versioned_name) {
  for (const HookEntry& e : kHooks) {
    if (std::strcmp(e.name, versioned_name) == 0) return e.hook;
  }
  return nullptr;
}

}  // namespace vmmshim

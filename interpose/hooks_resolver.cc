// The resolvers (cuGetProcAddress, cuGetProcAddress_v2) and HookFor, the
// routing table generated from interpose/hook_list.h. The real resolver
// answers first; only an answer that is exactly the address of a hooked
// export is replaced (route by address identity, never by name prefix:
// docs/architecture.md, "Measured driver facts").
#include <cstring>

#include "core/base/log.h"
#include "interpose/hooks.h"
#include "interpose/hooks_internal.h"

using vmmshim::GetRuntime;
using vmmshim::Log;
using vmmshim::Runtime;

namespace {

void* Substitute(const Runtime& rt, void* real_fn) {
  if (!rt.enabled()) {
    // Pass-through still answers the resolver self-lookup with the real
    // resolver, so later lookups bypass the shim entirely.
    return real_fn;
  }
  const char* name = rt.driver.NameOf(real_fn);
  if (name == nullptr) return real_fn;
  void* hook = vmmshim::HookFor(name);
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
    void* real = *pfn;
    *pfn = Substitute(*rt, *pfn);
    Log().trace("cuGetProcAddress_v2({}, {}, {:#x}) -> {}", symbol != nullptr ? symbol : "?",
                cuda_version, flags, *pfn != real ? "hooked" : "driver");
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
  if (r == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) *pfn = Substitute(*rt, *pfn);
  return r;
}

namespace vmmshim {
namespace {

struct HookEntry {
  const char* name;  // the driver export whose ABI the hook implements
  void* hook;
};

const HookEntry kHooks[] = {
#define VMMSHIM_HOOK_ENTRY(name, pfn) {#name, reinterpret_cast<void*>(&::name)},
    VMMSHIM_HOOKED_DRIVER_EXPORTS(VMMSHIM_HOOK_ENTRY)
#undef VMMSHIM_HOOK_ENTRY
};

}  // namespace

void* HookFor(const char* versioned_name) {
  for (const HookEntry& e : kHooks) {
    if (std::strcmp(e.name, versioned_name) == 0) return e.hook;
  }
  return nullptr;
}

}  // namespace vmmshim

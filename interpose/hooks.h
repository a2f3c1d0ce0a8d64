// The hooked driver entry points, by the versioned name of the driver export
// whose ABI each one implements.
#ifndef VMMSHIM_INTERPOSE_HOOKS_H_
#define VMMSHIM_INTERPOSE_HOOKS_H_

namespace vmmshim {

// Our hook for the driver export `versioned_name` ("cuMemAlloc_v2",
// "cuGetProcAddress", ...), or nullptr when that entry point is not hooked.
// Exact names only. Safe inside dlsym (no locks, no allocation).
void* HookFor(const char* versioned_name);

}  // namespace vmmshim

#endif  // VMMSHIM_INTERPOSE_HOOKS_H_

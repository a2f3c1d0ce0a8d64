// The dlsym override. cudart (static and shared) finds the driver with
// dlopen("libcuda.so.1") + dlsym(handle, "cuGetProcAddress_v2") and then asks
// that resolver for everything else (measured with an LD_PRELOAD logger on
// cudart 13, static and shared; docs/architecture.md); answering the
// resolver names here is what lets the shim see a static-cudart program.
//
// Rules kept (from other interposers' bug reports):
//   - exact-name allowlist (HookFor), never a prefix match;
//   - no allocation, lock of ours, logging or initialization in here;
//   - lookups made by libcuda itself get the real function;
//   - the pass-through path is a tail call to glibc's dlsym, so glibc still
//     sees the original caller's return address and RTLD_NEXT keeps its
//     meaning for every other library (this file is built with -O2 and
//     without stack protector so that the call compiles to a jump; a test
//     checks RTLD_NEXT behaviour under the preload).
#include <dlfcn.h>

#include <cstring>

#include "interpose/hooks.h"
#include "interpose/runtime.h"

namespace {

bool IsLibcuda(const char* path) {
  if (path == nullptr) return false;
  const char* slash = std::strrchr(path, '/');
  const char* base = slash != nullptr ? slash + 1 : path;
  return std::strncmp(base, "libcuda.so", 10) == 0;
}

bool InLibcuda(const void* address) {
  Dl_info info;
  return dladdr(address, &info) != 0 && IsLibcuda(info.dli_fname);
}

// For a hooked name: the real answer, replaced by our hook when it is
// exactly libcuda's export of that name and the caller is not libcuda.
__attribute__((noinline)) void* RoutedDlsym(void* handle, const char* symbol, void* hook,
                                            const void* caller) {
  void* real = vmmshim::RealDlsym()(handle, symbol);
  if (real == nullptr || InLibcuda(caller) || !InLibcuda(real)) return real;
  return hook;
}

}  // namespace

// x86-64: defined as dlsym@@GLIBC_2.34 (what programs built against glibc
// 2.34 or later ask for, and what other interposers' dlvsym(RTLD_NEXT,
// "dlsym", "GLIBC_2.34") finds) and dlsym@GLIBC_2.2.5 (programs built against
// older glibc, such as manylinux wheels), one function under both names.
// Elsewhere a plain, unversioned dlsym.
#if defined(__x86_64__)
#define VMMSHIM_DLSYM vmmshim_dlsym
extern "C" void* vmmshim_dlsym(void* handle, const char* symbol);
extern "C" __attribute__((visibility("default"), alias("vmmshim_dlsym"))) void*
vmmshim_dlsym_2_2_5(void* handle, const char* symbol);
__asm__(".symver vmmshim_dlsym, dlsym@@GLIBC_2.34");
__asm__(".symver vmmshim_dlsym_2_2_5, dlsym@GLIBC_2.2.5");
#else
#define VMMSHIM_DLSYM dlsym
#endif

extern "C" __attribute__((visibility("default"))) void* VMMSHIM_DLSYM(void* handle,
                                                                     const char* symbol) {
  // glibc declares `symbol` nonnull; like glibc, we do not test it.
  if (__builtin_expect(symbol[0] == 'c' && symbol[1] == 'u', 0)) {
    if (void* hook = vmmshim::HookFor(symbol)) {
      return RoutedDlsym(handle, symbol, hook, __builtin_return_address(0));
    }
  }
  return vmmshim::RealDlsym()(handle, symbol);
}

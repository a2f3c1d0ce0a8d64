/* Preloaded after libvmmshim.so. Its dlsym(RTLD_NEXT, ...) must find the
 * definition in the next object after *this* library (rtld_next_b), not the
 * one after the shim (which would be this library's own). */
#define _GNU_SOURCE
#include <dlfcn.h>

__attribute__((visibility("default"))) const char* probe_symbol(void) { return "a"; }

__attribute__((visibility("default"))) const char* probe_next(void) {
  const char* (*next)(void) = (const char* (*)(void))dlsym(RTLD_NEXT, "probe_symbol");
  return next ? next() : "none";
}

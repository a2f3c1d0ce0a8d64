/* Another interposer of dlsym (as profilers and other shims have): it counts
 * lookups and forwards to the next dlsym. Preloaded before or after
 * libvmmshim.so, the shim's routing must still work. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void* (*DlsymFn)(void*, const char*);
static unsigned long g_lookups = 0;

__attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  static DlsymFn next = NULL;
  if (next == NULL) next = (DlsymFn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (next == NULL) next = (DlsymFn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  ++g_lookups;
  return next(handle, name);
}

__attribute__((destructor)) static void Report(void) {
  if (getenv("OTHER_DLSYM_REPORT") != NULL) fprintf(stderr, "other_dlsym: %lu lookups\n", g_lookups);
}

/* Compiles against the installed C API header and finds the API the way
 * the header says (dlsym), here in the installed library itself: prints
 * whether vmmshim_release_cached_memory was found. */
#include <dlfcn.h>
#include <stdio.h>

#include <vmmshim/vmmshim.h>

int main(void) {
  void* lib = dlopen(VMMSHIM_PRELOAD_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "consumer: cannot open %s: %s\n", VMMSHIM_PRELOAD_LIBRARY, dlerror());
    return 1;
  }
  typedef int (*ReleaseFn)(int, size_t*);
  ReleaseFn release = (ReleaseFn)dlsym(lib, "vmmshim_release_cached_memory");
  printf("consumer: %s exports vmmshim_release_cached_memory: %s\n", VMMSHIM_PRELOAD_LIBRARY,
         release != NULL ? "yes" : "no");
  return release != NULL ? 0 : 1;
}

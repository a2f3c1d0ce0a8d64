/* Needs LD_PRELOAD="libvmmshim.so librtld_next_a.so"; linked with rtld_next_b. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

const char* probe_symbol(void);

int main(void) {
  const char* (*probe_next)(void) = (const char* (*)(void))dlsym(RTLD_DEFAULT, "probe_next");
  if (probe_next == NULL) {
    fprintf(stderr, "librtld_next_a.so is not preloaded\n");
    return 2;
  }
  if (strcmp(probe_symbol(), "a") != 0) {  /* the preload comes first */
    fprintf(stderr, "librtld_next_a.so is not ahead of librtld_next_b.so\n");
    return 2;
  }
  const char* got = probe_next();
  printf("RTLD_NEXT from the second preload found %s (want b)\n", got);
  return strcmp(got, "b") != 0;
}

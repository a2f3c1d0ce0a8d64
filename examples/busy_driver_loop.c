/* A driver-API program (linked with -lcuda) that keeps calling the driver
 * while an operator sleeps and wakes it from outside: tools/demo.sh runs it
 * under the shim on the simulated driver and puts it to sleep with
 * `vmmshim sleep PID` in the middle of its loop. It holds 64 MiB of a known
 * pattern and, for SECONDS seconds (default 6), copies a piece back and
 * checks it every 20 ms; a call made while the process sleeps waits for the
 * wake (the shim's gate, then the driver's lock). Prints "ready PID" when its
 * memory is in place and, at the end, how many checks ran and whether every
 * one matched. Exit status 0 when all did. Runs unchanged on a real GPU. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "driver_check.h"

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? atof(argv[1]) : 6.0;
  const size_t words = (64u << 20) / sizeof(unsigned);
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr p;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuMemAlloc(&p, words * sizeof(unsigned)));
  {
    static unsigned chunk[1 << 18];  /* 1 MiB of the pattern */
    for (size_t i = 0; i < sizeof chunk / sizeof chunk[0]; ++i) chunk[i] = 0x5eed5eedu;
    for (size_t at = 0; at < words * sizeof(unsigned); at += sizeof chunk) {
      CHECK(cuMemcpyHtoD(p + at, chunk, sizeof chunk));
    }
  }
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  int checks = 0, bad = 0;
  double longest = 0;
  const double end = Now() + seconds;
  while (Now() < end) {
    unsigned piece[1024];
    const size_t at = ((size_t)checks * 7919u) % (words - 1024);
    const double before = Now();
    CHECK(cuMemcpyDtoH(piece, p + at * sizeof(unsigned), sizeof piece));
    const double took = Now() - before;
    if (took > longest) longest = took;
    for (int i = 0; i < 1024; ++i) bad += piece[i] != 0x5eed5eedu;
    ++checks;
    usleep(20000);
  }
  CHECK(cuMemFree(p));
  printf("%d checks of the 64 MiB pattern, %s; the longest call waited %.2f s\n", checks,
         bad == 0 ? "every one matched" : "SOME DIFFERED", longest);
  return bad == 0 ? 0 : 1;
}

/* The CPU cost the submission gate adds to a work-submitting call: a program
 * linked against libcuda.so.1 calls cuLaunchKernel (of the simulated driver,
 * which returns at once for a launch without parameters) a million times per
 * run, best of 5 runs, 4 rounds; run natively and under LD_PRELOAD=
 * libvmmshim.so (bench/gated_call_cost.sh alternates them), the difference
 * is what the gated hook costs per call on this CPU. The launch path on a GPU
 * is measured by bench/launch_gate_bench.cu.
 * usage: gated_call_cost   (prints "gated_call_ns N" per round) */
#include <cuda.h>
#include <stdio.h>
#include <time.h>

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void) {
  CUcontext ctx;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    fprintf(stderr, "gated_call_cost: no driver context\n");
    return 1;
  }
  enum { kCalls = 1000000, kRuns = 5, kRounds = 4 };
  for (int round = 0; round < kRounds; ++round) {
    double best = 1e300;
    for (int run = 0; run < kRuns; ++run) {
      const double start = Now();
      for (int i = 0; i < kCalls; ++i) {
        if (cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
          fprintf(stderr, "gated_call_cost: cuLaunchKernel failed\n");
          return 1;
        }
      }
      const double per_call = (Now() - start) / kCalls;
      if (per_call < best) best = per_call;
    }
    if (round > 0) printf("gated_call_ns %.1f\n", best); /* round 0: warm-up */
  }
  return 0;
}

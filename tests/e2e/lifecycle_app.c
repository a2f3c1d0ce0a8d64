/* Context lifecycle, stream-ordered free and fork under load, under
 * LD_PRELOAD=libvmmshim.so on the simulated libcuda.so.1.
 *   - cuDevicePrimaryCtxReset (cudaDeviceReset) releases the shim's memory of
 *     that context: device memory returns to its starting value, old pointers
 *     are unknown, and allocating afterwards works;
 *   - the last cuDevicePrimaryCtxRelease and cuCtxDestroy do the same;
 *   - cuMemFreeAsync frees shim memory (after the stream's work), and is
 *     refused during stream capture;
 *   - fork() while 4 threads allocate and free: every child runs (no lock
 *     inherited held) and its driver calls reach the driver. */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

size_t simcuDeviceBytesInUse(int device);
CUresult cuCtxCreate_v2(CUcontext* ctx, unsigned int flags, CUdevice device);  /* simulated */

#include "expect.h"

static CUcontext Primary(int device) {
  CUcontext ctx = NULL;
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, device), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  return ctx;
}

static void RoundTrip(const char* what) {
  CUdeviceptr p = 0;
  int v = 42, back = 0;
  EXPECT_EQ(cuMemAlloc(&p, 8 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyHtoD(p, &v, sizeof v), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyDtoH(&back, p, sizeof back), CUDA_SUCCESS);
  EXPECT_EQ(back, 42);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
  printf("%s: allocate, write, read, free: ok\n", what);
}

static volatile int stop = 0;
static void* Churn(void* arg) {
  CUcontext ctx = (CUcontext)arg;
  cuCtxSetCurrent(ctx);
  unsigned seed = 1;
  while (!stop) {
    CUdeviceptr p;
    size_t bytes = (size_t)(rand_r(&seed) % 4 + 1) << (rand_r(&seed) % 2 ? 8 : 21);
    if (cuMemAlloc(&p, bytes) == CUDA_SUCCESS) cuMemFree(p);
  }
  return NULL;
}

int main(void) {
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  const size_t baseline = simcuDeviceBytesInUse(0);
  CUcontext ctx = Primary(0);

  /* cudaDeviceReset. */
  CUdeviceptr large = 0, small = 0, cached = 0;
  EXPECT_EQ(cuMemAlloc(&large, 64 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&small, 1000), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&cached, 16 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(cached), CUDA_SUCCESS);
  EXPECT_EQ(simcuDeviceBytesInUse(0) > baseline, 1);
  EXPECT_EQ(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
  EXPECT_EQ(simcuDeviceBytesInUse(0), baseline);
  printf("reset: device memory back to %zu bytes\n", simcuDeviceBytesInUse(0));
  EXPECT_EQ(cuMemFree(large), CUDA_ERROR_INVALID_VALUE);  /* gone, as the driver says */
  ctx = Primary(0);
  RoundTrip("after reset");

  /* The last release of the primary context. */
  EXPECT_EQ(cuMemAlloc(&large, 32 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  EXPECT_EQ(simcuDeviceBytesInUse(0), baseline);
  printf("last primary release: device memory back to %zu bytes\n", simcuDeviceBytesInUse(0));
  ctx = Primary(0);

  /* cuCtxDestroy of a created context. */
  CUcontext created = NULL;
  const size_t base1 = simcuDeviceBytesInUse(1);
  EXPECT_EQ(cuCtxCreate_v2(&created, 0, 1), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&large, 32 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy(created), CUDA_SUCCESS);
  EXPECT_EQ(simcuDeviceBytesInUse(1), base1);
  printf("context destroyed: device 1 memory back to %zu bytes\n", simcuDeviceBytesInUse(1));
  cuCtxSetCurrent(ctx);

  /* cuMemFreeAsync of shim memory. */
  CUdeviceptr a = 0, b = 0;
  EXPECT_EQ(cuMemAlloc(&a, 4 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&b, 4 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(a), CUDA_ERROR_INVALID_VALUE);  /* already freed */
  /* During stream captures: the driver's codes (H200, core/sync/capture.h). */
  CUstream s = (CUstream)0x5ca97;
  CUgraph graph = NULL;
  EXPECT_EQ(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeAsync(b, s), CUDA_ERROR_INVALID_VALUE); /* a graph frees graph memory only */
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);  /* deferred: a capturing context is not synchronized */
  EXPECT_EQ(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);  /* the capture went on */
  EXPECT_EQ(cuMemAlloc(&b, 4 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(b), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUdeviceptr c = 0;
  EXPECT_EQ(cuMemAlloc(&c, 256), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamEndCapture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);  /* still live after the refusal */
  printf("cuMemFreeAsync and captures: ok\n");

  /* fork while other threads allocate and free. */
  pthread_t threads[4];
  for (int i = 0; i < 4; ++i) pthread_create(&threads[i], NULL, Churn, ctx);
  int children_ok = 0;
  for (int i = 0; i < 40; ++i) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(20);  /* a deadlocked child dies instead of hanging the test */
      cuCtxSetCurrent(ctx);
      CUdeviceptr p = 0;
      CUresult r = cuMemAlloc(&p, 1 << 20);  /* reaches the driver in the child */
      if (r == CUDA_SUCCESS) r = cuMemFree(p);
      _exit(r == CUDA_SUCCESS ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    children_ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  stop = 1;
  for (int i = 0; i < 4; ++i) pthread_join(threads[i], NULL);
  EXPECT_EQ(children_ok, 40);
  printf("fork under load: %d of 40 children ran\n", children_ok);
  RoundTrip("parent after the forks");
  printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}

/* Under the shim on the simulated driver: the parent allocates (so the shim
 * is initialized), forks; the child allocates, writes, reads and frees with
 * the inherited state, and so does the parent afterwards. */
#include <cuda.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static int RoundTrip(const char* who) {
  CUdeviceptr p;
  int v = 42, back = 0;
  if (cuMemAlloc(&p, 8 << 20) != CUDA_SUCCESS || cuMemcpyHtoD(p, &v, sizeof v) != CUDA_SUCCESS ||
      cuMemcpyDtoH(&back, p, sizeof back) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS ||
      back != 42) {
    printf("%s: FAILED\n", who);
    fflush(stdout);
    return 1;
  }
  printf("%s: ok\n", who);
  fflush(stdout);  /* the child leaves with _exit */
  return 0;
}

int main(void) {
  CUcontext ctx;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    return 2;
  }
  CUdeviceptr keep;
  if (cuMemAlloc(&keep, 4096) != CUDA_SUCCESS) return 2;
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    cuCtxSetCurrent(ctx);  /* the calling thread's current context is per thread */
    _exit(RoundTrip("child"));
  }
  int status = 0;
  waitpid(child, &status, 0);
  int bad = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  bad |= RoundTrip("parent");
  bad |= cuMemFree(keep) != CUDA_SUCCESS;
  printf("%s\n", bad ? "FAILED" : "OK");
  return bad;
}

/* CUDA IPC between two processes, both under LD_PRELOAD=libvmmshim.so on the
 * simulated libcuda.so.1: an unmodified driver-API program.
 *
 * The parent allocates shim memory (a large allocation and a small, packed
 * one), writes a pattern, exports both with cuIpcGetMemHandle and starts
 * itself again as a child (fork + exec: a fresh process, as a CUDA program
 * must be) with the handles in hex. The child opens them on device 1, checks
 * the pattern, writes its answer, opens again (same pointer), closes, and
 * tries every bad handle. The parent checks the answer; then the exporter
 * frees while another child still maps the memory (the memory lives on),
 * and a last child finds the freed allocation's handle stale. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "expect.h"

#define LARGE (4 << 20)
#define SMALL 1000

static void ToHex(const CUipcMemHandle* h, char* out) {
  for (int i = 0; i < 64; ++i) sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static CUipcMemHandle FromHex(const char* s) {
  CUipcMemHandle h;
  for (int i = 0; i < 64; ++i) {
    unsigned v;
    sscanf(s + 2 * i, "%2x", &v);
    h.reserved[i] = (char)v;
  }
  return h;
}

static void Context(int device) {
  CUcontext ctx;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    fprintf(stderr, "no context\n");
    exit(2);
  }
}

static int Spawn(const char* self, const char* mode, const char* a, const char* b, int in_fd,
                 int out_fd) {
  char in_s[16], out_s[16];
  snprintf(in_s, sizeof in_s, "%d", in_fd);
  snprintf(out_s, sizeof out_s, "%d", out_fd);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl(self, self, mode, a, b, in_s, out_s, (char*)NULL);
    _exit(127);
  }
  return pid;
}

static int Wait(int pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int Child(const char* large_hex, const char* small_hex) {
  Context(1);  /* another device than the exporter's */
  CUipcMemHandle large = FromHex(large_hex), small = FromHex(small_hex);
  CUdeviceptr p = 0, p2 = 0, s = 0;
  EXPECT_EQ(cuIpcOpenMemHandle(&p, large, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
  unsigned char buf[256];
  EXPECT_EQ(cuMemcpyDtoH(buf, p + 4096, sizeof buf), CUDA_SUCCESS);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(buf[i], (unsigned char)i);
  const char answer[] = "the importer was here";
  EXPECT_EQ(cuMemcpyHtoD(p, answer, sizeof answer), CUDA_SUCCESS);
  EXPECT_EQ(cuIpcOpenMemHandle(&p2, large, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
  EXPECT_EQ(p2, p);
  EXPECT_EQ(cuIpcOpenMemHandle(&s, small, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
  int v = 0;
  EXPECT_EQ(cuMemcpyDtoH(&v, s, sizeof v), CUDA_SUCCESS);
  EXPECT_EQ(v, 0x5a11);

  /* Bad handles: corrupted token, corrupted padding, truncated, guessed. */
  CUipcMemHandle bad = large;
  CUdeviceptr q = 0;
  bad.reserved[30] ^= 1;
  EXPECT_EQ(cuIpcOpenMemHandle(&q, bad, 0), CUDA_ERROR_INVALID_VALUE);
  bad = large;
  bad.reserved[60] = 7;
  EXPECT_EQ(cuIpcOpenMemHandle(&q, bad, 0), CUDA_ERROR_INVALID_VALUE);
  bad = large;
  memset(bad.reserved + 20, 0, 44);
  EXPECT_EQ(cuIpcOpenMemHandle(&q, bad, 0), CUDA_ERROR_INVALID_VALUE);
  bad = large;
  for (int i = 24; i < 40; ++i) bad.reserved[i] = (char)rand();
  EXPECT_EQ(cuIpcOpenMemHandle(&q, bad, 0), CUDA_ERROR_INVALID_VALUE);
  /* Flags the driver rejects. */
  EXPECT_EQ(cuIpcOpenMemHandle(&q, large, 0x40), CUDA_ERROR_INVALID_VALUE);
  /* Not a vmmshim handle: the driver's answer (the simulation has no
   * cross-process legacy IPC). */
  CUipcMemHandle zero;
  memset(&zero, 0, sizeof zero);
  EXPECT_EQ(cuIpcOpenMemHandle(&q, zero, 0), CUDA_ERROR_INVALID_VALUE);

  EXPECT_EQ(cuIpcCloseMemHandle(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyDtoH(buf, p, 1), CUDA_SUCCESS);  /* one reference left */
  EXPECT_EQ(cuIpcCloseMemHandle(p), CUDA_SUCCESS);
  EXPECT_EQ(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);  /* the driver's */
  EXPECT_EQ(cuIpcCloseMemHandle(s), CUDA_SUCCESS);
  return failures ? 1 : 0;
}

/* Opens, tells the parent, waits until it has freed, then reads. */
static int Holder(const char* large_hex, int in_fd, int out_fd) {
  Context(0);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuIpcOpenMemHandle(&p, FromHex(large_hex), 0), CUDA_SUCCESS);
  char c = 'o';
  if (write(out_fd, &c, 1) != 1 || read(in_fd, &c, 1) != 1) return 3;
  unsigned char buf[256];
  EXPECT_EQ(cuMemcpyDtoH(buf, p + 4096, sizeof buf), CUDA_SUCCESS);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(buf[i], (unsigned char)i);
  EXPECT_EQ(cuIpcCloseMemHandle(p), CUDA_SUCCESS);
  return failures ? 1 : 0;
}

static int Stale(const char* large_hex) {
  Context(0);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuIpcOpenMemHandle(&p, FromHex(large_hex), 0), CUDA_ERROR_INVALID_VALUE);
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc == 6 && strcmp(argv[1], "child") == 0) return Child(argv[2], argv[3]);
  if (argc == 6 && strcmp(argv[1], "holder") == 0) {
    return Holder(argv[2], atoi(argv[4]), atoi(argv[5]));
  }
  if (argc == 6 && strcmp(argv[1], "stale") == 0) return Stale(argv[2]);

  Context(0);
  CUdeviceptr large = 0, small = 0;
  EXPECT_EQ(cuMemAlloc(&large, LARGE), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc(&small, SMALL), CUDA_SUCCESS);
  unsigned char pattern[256];
  for (int i = 0; i < 256; ++i) pattern[i] = (unsigned char)i;
  EXPECT_EQ(cuMemcpyHtoD(large + 4096, pattern, sizeof pattern), CUDA_SUCCESS);
  int v = 0x5a11;
  EXPECT_EQ(cuMemcpyHtoD(small, &v, sizeof v), CUDA_SUCCESS);
  CUipcMemHandle hl, hs;
  EXPECT_EQ(cuIpcGetMemHandle(&hl, large), CUDA_SUCCESS);
  EXPECT_EQ(cuIpcGetMemHandle(&hs, small), CUDA_SUCCESS);
  EXPECT_EQ(memcmp(hl.reserved, "VMSH", 4), 0);
  char large_hex[129], small_hex[129];
  ToHex(&hl, large_hex);
  ToHex(&hs, small_hex);
  /* Opening one's own handle: refused, as the driver refuses it. */
  CUdeviceptr own = 0;
  EXPECT_EQ(cuIpcOpenMemHandle(&own, hl, 0), CUDA_ERROR_INVALID_CONTEXT);

  EXPECT_EQ(Wait(Spawn(argv[0], "child", large_hex, small_hex, -1, -1)), 0);
  char answer[32] = {0};
  EXPECT_EQ(cuMemcpyDtoH(answer, large, sizeof answer), CUDA_SUCCESS);
  EXPECT_EQ(strcmp(answer, "the importer was here"), 0);
  printf("child read the pattern and wrote: %s\n", answer);

  /* The exporter frees while a holder maps it. */
  int to_child[2], from_child[2];
  /* The parent's ends close on exec; the child's ends are closed here after
   * the fork, so an early exit of either side ends the other's read. */
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return 2;
  fcntl(to_child[0], F_SETFD, 0);
  fcntl(from_child[1], F_SETFD, 0);
  int holder = Spawn(argv[0], "holder", large_hex, small_hex, to_child[0], from_child[1]);
  close(to_child[0]);
  close(from_child[1]);
  char c;
  if (read(from_child[0], &c, 1) != 1) return 2;
  EXPECT_EQ(cuMemFree(large), CUDA_SUCCESS);
  if (write(to_child[1], &c, 1) != 1) return 2;
  EXPECT_EQ(Wait(holder), 0);
  printf("a holder read the memory after the exporter freed it\n");

  EXPECT_EQ(Wait(Spawn(argv[0], "stale", large_hex, small_hex, -1, -1)), 0);
  printf("the freed allocation's handle is stale\n");
  EXPECT_EQ(cuMemFree(small), CUDA_SUCCESS);
  printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}

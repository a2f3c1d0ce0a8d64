// Two processes share device memory with cudaIpcGetMemHandle /
// cudaIpcOpenMemHandle, with kernels on both sides: an ordinary CUDA
// program, run natively and under LD_PRELOAD=libvmmshim.so (where the
// memory is VMM memory, which the driver's own IPC rejects).
//
//   ipc_share            the exporter: allocates a large and a small buffer,
//                        fills them with a kernel, exports them, starts
//                        itself again as the importer (fork + exec), checks
//                        what the importer wrote; then frees while a second
//                        importer still maps the buffer.
// Lines starting with PROBE are return codes that must be the same natively
// and under the shim; INFO lines may differ.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda_check.h"

namespace {

constexpr size_t kLarge = size_t{64} << 20;  // bytes
constexpr size_t kSmall = 1000;
constexpr int kInts = static_cast<int>(kLarge / sizeof(int));

__global__ void Fill(int* p, int n, int scale, int add) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = i * scale + add;
  }
}

__global__ void Count(const int* p, int n, int scale, int add, unsigned long long* bad) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (p[i] != i * scale + add) atomicAdd(bad, 1ULL);
  }
}

// Mismatches of p[0..n) against i * scale + add, counted on the GPU.
unsigned long long Mismatches(const int* p, int n, int scale, int add) {
  unsigned long long* bad;
  CHECK_CUDA(cudaMalloc(&bad, sizeof *bad));
  CHECK_CUDA(cudaMemset(bad, 0, sizeof *bad));
  Count<<<256, 256>>>(p, n, scale, add, bad);
  CHECK_CUDA(cudaGetLastError());
  unsigned long long h = 0;
  CHECK_CUDA(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(bad));
  return h;
}

std::string Hex(const cudaIpcMemHandle_t& h) {
  std::string s;
  char b[3];
  for (unsigned char c : h.reserved) {
    std::snprintf(b, sizeof b, "%02x", c);
    s += b;
  }
  return s;
}

cudaIpcMemHandle_t FromHex(const char* s) {
  cudaIpcMemHandle_t h;
  for (int i = 0; i < 64; ++i) {
    unsigned v;
    std::sscanf(s + 2 * i, "%2x", &v);
    h.reserved[i] = static_cast<char>(v);
  }
  return h;
}

int Run(const char* self, const char* mode, const std::string& a, const std::string& b,
        int in_fd = -1, int out_fd = -1) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    const std::string in = std::to_string(in_fd), out = std::to_string(out_fd);
    execl(self, self, mode, a.c_str(), b.c_str(), in.c_str(), out.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (in_fd >= 0) return pid;  // the caller waits
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int Importer(const char* large_hex, const char* small_hex) {
  CHECK_CUDA(cudaSetDevice(0));
  int* p = nullptr;
  CHECK_CUDA(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&p), FromHex(large_hex),
                                  cudaIpcMemLazyEnablePeerAccess));
  const unsigned long long bad = Mismatches(p, kInts, 3, 1);
  std::printf("importer: %llu mismatches in the exporter's %d ints\n", bad, kInts);
  Fill<<<256, 256>>>(p, kInts, 7, 5);  // the answer
  CHECK_CUDA(cudaDeviceSynchronize());
  int* again = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(reinterpret_cast<void**>(&again), FromHex(large_hex),
                                       cudaIpcMemLazyEnablePeerAccess);
  std::printf("PROBE open the same handle again: %d, same pointer: %s\n", e,
              e == cudaSuccess ? (again == p ? "yes" : "no") : "-");
  if (e == cudaSuccess) std::printf("PROBE close the second: %d\n", cudaIpcCloseMemHandle(again));
  int* s = nullptr;
  CHECK_CUDA(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&s), FromHex(small_hex),
                                  cudaIpcMemLazyEnablePeerAccess));
  std::printf("importer: %llu mismatches in the small buffer\n",
              Mismatches(s, kSmall / sizeof(int), 2, 9));
  std::printf("PROBE close: %d\n", cudaIpcCloseMemHandle(s));
  std::printf("PROBE close: %d\n", cudaIpcCloseMemHandle(p));
  std::printf("PROBE close again: %d\n", cudaIpcCloseMemHandle(p));
  cudaGetLastError();
  cudaIpcMemHandle_t corrupt = FromHex(large_hex);
  corrupt.reserved[30] ^= 1;
  int* q = nullptr;
  std::printf("INFO corrupted handle: %d\n",
              cudaIpcOpenMemHandle(reinterpret_cast<void**>(&q), corrupt,
                                   cudaIpcMemLazyEnablePeerAccess));
  cudaGetLastError();
  return bad == 0 ? 0 : 1;
}

int Holder(const char* large_hex, int in_fd, int out_fd) {
  CHECK_CUDA(cudaSetDevice(0));
  int* p = nullptr;
  CHECK_CUDA(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&p), FromHex(large_hex),
                                  cudaIpcMemLazyEnablePeerAccess));
  char c = 'o';
  if (write(out_fd, &c, 1) != 1 || read(in_fd, &c, 1) != 1) return 3;
  const unsigned long long bad = Mismatches(p, kInts, 7, 5);
  std::printf("holder: %llu mismatches after the exporter freed the buffer\n", bad);
  CHECK_CUDA(cudaIpcCloseMemHandle(p));
  return bad == 0 ? 0 : 1;
}

int Stale(const char* large_hex) {
  CHECK_CUDA(cudaSetDevice(0));
  int* p = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(reinterpret_cast<void**>(&p), FromHex(large_hex),
                                       cudaIpcMemLazyEnablePeerAccess);
  std::printf("INFO open after the exporter freed (stale handle): %d\n", e);
  if (e == cudaSuccess) cudaIpcCloseMemHandle(p);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::strcmp(argv[1], "importer") == 0) return Importer(argv[2], argv[3]);
  if (argc == 6 && std::strcmp(argv[1], "holder") == 0) {
    return Holder(argv[2], std::atoi(argv[4]), std::atoi(argv[5]));
  }
  if (argc == 6 && std::strcmp(argv[1], "stale") == 0) return Stale(argv[2]);

  CHECK_CUDA(cudaSetDevice(0));
  int *large = nullptr, *small = nullptr;
  CHECK_CUDA(cudaMalloc(&large, kLarge));
  CHECK_CUDA(cudaMalloc(&small, kSmall));
  Fill<<<256, 256>>>(large, kInts, 3, 1);
  Fill<<<1, 256>>>(small, kSmall / sizeof(int), 2, 9);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaIpcMemHandle_t hl, hs;
  CHECK_CUDA(cudaIpcGetMemHandle(&hl, large));
  CHECK_CUDA(cudaIpcGetMemHandle(&hs, small));
  int* own = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(reinterpret_cast<void**>(&own), hl,
                                       cudaIpcMemLazyEnablePeerAccess);
  std::printf("PROBE open own handle in the exporting process: %d\n", e);
  cudaGetLastError();
  cudaIpcMemHandle_t dummy;
  std::printf("PROBE get handle of a host pointer: %d\n",
              cudaIpcGetMemHandle(&dummy, &dummy));
  cudaGetLastError();

  const int rc = Run(argv[0], "importer", Hex(hl), Hex(hs));
  const unsigned long long bad = Mismatches(large, kInts, 7, 5);
  std::printf("exporter: importer exit %d, %llu mismatches in the importer's answer\n", rc, bad);

  int to_child[2], from_child[2];
  // The parent's ends close on exec; the child's ends are closed here after
  // the fork, so an early exit of either side ends the other's read.
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return 2;
  fcntl(to_child[0], F_SETFD, 0);
  fcntl(from_child[1], F_SETFD, 0);
  const int holder = Run(argv[0], "holder", Hex(hl), Hex(hs), to_child[0], from_child[1]);
  close(to_child[0]);
  close(from_child[1]);
  char c;
  if (read(from_child[0], &c, 1) != 1) return 2;
  CHECK_CUDA(cudaFree(large));
  if (write(to_child[1], &c, 1) != 1) return 2;
  int status = 0;
  waitpid(holder, &status, 0);
  const int holder_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  std::printf("exporter: freed while the holder mapped it; holder exit %d\n", holder_rc);
  Run(argv[0], "stale", Hex(hl), Hex(hs));
  CHECK_CUDA(cudaFree(small));
  const bool ok = rc == 0 && bad == 0 && holder_rc == 0;
  std::printf("ipc_share: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

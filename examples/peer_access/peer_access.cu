// Per-allocation peer access, shown on two GPUs: device 1 owns four buffers
// (4 KiB, 512 KiB, 64 MiB, and a 4 KiB buffer tagged "shared"), device 0
// enables peer access to device 1 (cudaDeviceEnablePeerAccess) and a kernel
// on device 0 reads each buffer that the shim says it may read.
//
//   peer_access                              # natively: every buffer
//   LD_PRELOAD=libvmmshim.so VMMSHIM_PEER_POLICY=min-size VMMSHIM_PEER_MIN_BYTES=1M peer_access
//
// Which reads are allowed under each policy is tabled in docs/peer-access.md.
// A read the policy denies would fault (or, over NVLink, could hang), so the
// program asks vmmshim_query_peer_access first and skips denied buffers. On a
// machine with one GPU it says so and exits 0.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "vmmshim/vmmshim.h"

#include "../cuda_check.h"

__global__ void Sum(const unsigned int* data, size_t words, unsigned long long* out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x) {
    s += data[i];
  }
  atomicAdd(out, s);
}

int main() {
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::printf("peer_access: this machine has %d GPU(s); the example needs two (device 0 reads "
                "device 1's memory). Nothing to show here.\n", devices);
    return 0;
  }
  int can = 0;
  CHECK_CUDA(cudaDeviceCanAccessPeer(&can, 0, 1));
  if (!can) {
    std::printf("peer_access: device 0 cannot access device 1 (cudaDeviceCanAccessPeer = 0)\n");
    return 0;
  }
  auto set_tag = reinterpret_cast<vmmshim_set_allocation_tag_fn>(
      dlsym(RTLD_DEFAULT, "vmmshim_set_allocation_tag"));
  auto query = reinterpret_cast<vmmshim_query_peer_access_fn>(
      dlsym(RTLD_DEFAULT, "vmmshim_query_peer_access"));
  std::printf("peer_access: %s\n", query ? "running under vmmshim" : "running natively");

  struct Buffer {
    const char* name;
    size_t bytes;
    const char* tag;
    unsigned int* ptr;
  } buffers[] = {{"4 KiB", 4096, nullptr, nullptr},
                 {"512 KiB", 512 * 1024, nullptr, nullptr},
                 {"64 MiB", size_t{64} << 20, nullptr, nullptr},
                 {"4 KiB tagged \"shared\"", 4096, "shared", nullptr}};
  CHECK_CUDA(cudaSetDevice(1));
  for (Buffer& b : buffers) {
    if (set_tag) set_tag(b.tag);
    CHECK_CUDA(cudaMalloc(&b.ptr, b.bytes));
    CHECK_CUDA(cudaMemset(b.ptr, 1, b.bytes));  // every word 0x01010101
  }
  if (set_tag) set_tag(nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());

  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  unsigned long long* sum = nullptr;
  CHECK_CUDA(cudaMalloc(&sum, sizeof *sum));
  int failures = 0;
  for (const Buffer& b : buffers) {
    int allowed = 1;
    if (query && query(b.ptr, 0, &allowed) != 0) allowed = 0;
    if (!allowed) {
      std::printf("  %-22s denied by the policy: not read\n", b.name);
      continue;
    }
    CHECK_CUDA(cudaMemset(sum, 0, sizeof *sum));
    const size_t words = b.bytes / 4;
    Sum<<<256, 256>>>(b.ptr, words, sum);
    CHECK_CUDA(cudaGetLastError());
    unsigned long long got = 0;
    CHECK_CUDA(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost));
    const bool ok = got == words * 0x01010101ull;
    failures += !ok;
    std::printf("  %-22s read by device 0: %s\n", b.name, ok ? "correct" : "WRONG");
  }
  CHECK_CUDA(cudaDeviceDisablePeerAccess(1));
  CHECK_CUDA(cudaFree(sum));
  CHECK_CUDA(cudaSetDevice(1));
  for (Buffer& b : buffers) CHECK_CUDA(cudaFree(b.ptr));
  std::printf("%s\n", failures ? "FAILED" : "PASSED");
  return failures != 0;
}

// A cudart malloc/free loop as a program without a pool makes it, for
// side-by-side runs of native, vmmshim and torch_memory_saver
// (tools/gpu/compare-tms.sh). Linked with the *shared* cudart, because
// torch_memory_saver's preload library replaces the cudaMalloc/cudaFree
// symbols (vmmshim hooks the driver and serves either build).
//
// A resident set of 1,000 live allocations (log-uniform 256 B .. 8 MiB) is
// made first; then 200 unmeasured and 20,000 measured iterations each
// allocate a buffer of a random size from the same distribution, set its
// first bytes, and free it. Prints the total time and a checksum read back
// from the device. When torch_memory_saver's library is loaded it enters its
// region (tms_set_interesting_region), as its Python region() does, so that
// it serves these calls.
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.h"

int main() {
  using SetRegion = void (*)(bool);
  if (auto set = reinterpret_cast<SetRegion>(dlsym(RTLD_DEFAULT, "tms_set_interesting_region"))) {
    set(true);
    std::printf("cudart_loop: in torch_memory_saver's region\n");
  }
  CHECK_CUDA(cudaFree(nullptr));
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> logsize(8, 23);
  std::vector<void*> resident(1000);
  for (void*& p : resident) CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(std::exp2(logsize(rng)))));
  unsigned char* probe = nullptr;
  CHECK_CUDA(cudaMalloc(&probe, 256));
  unsigned long long checksum = 0;
  auto iterate = [&](int i) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(std::exp2(logsize(rng)))));
    CHECK_CUDA(cudaMemsetAsync(p, i & 0xff, 64));
    CHECK_CUDA(cudaMemcpyAsync(probe + (i & 0xff), p, 1, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaFree(p));
  };
  for (int i = 0; i < 200; ++i) iterate(i);
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000; ++i) iterate(i);
  CHECK_CUDA(cudaDeviceSynchronize());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  unsigned char host[256];
  CHECK_CUDA(cudaMemcpy(host, probe, sizeof host, cudaMemcpyDeviceToHost));
  for (unsigned char c : host) checksum = checksum * 31 + c;
  std::printf("cudart_loop: %.1f ms for 20000 iterations (%.2f us each), checksum %llu\n", ms,
              ms * 1e3 / 20000, checksum);
  for (void* p : resident) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(probe));
  return 0;
}

/* A ring exchange between GPUs, written against the driver API so that it
 * also runs on the simulated driver (4 devices there: SIMCUDA_DEVICES=4):
 * the README's main job runs it under `vmmshim compare` on a machine without
 * a GPU.
 *
 * Every device allocates its working set (200 buffers of 256 KiB that only
 * it uses) and one 8 MiB exchange buffer; then, as frameworks do, every
 * device enables peer access to every other (cuCtxEnablePeerAccess, the
 * driver call under cudaDeviceEnablePeerAccess), and each device reads the
 * next device's exchange buffer from its own context. Natively, and under
 * policy all, every allocation is mapped into every peer; under min-size:1M
 * only the exchange buffers are, and the reads still work; under none the
 * first read fails and the program exits 1.
 *
 * The read is a cuMemcpyDtoH issued in the reading device's context: on the
 * simulated driver that copy checks the reading device's access to the
 * memory, as a kernel's load would on a GPU. (A real GPU's copy engines do
 * not need peer mappings, so on real GPUs use examples/peer_access instead.)
 *
 *   peer_exchange [DEVICES]      (default: all devices, at most 8) */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define kMaxDevices 8
#define kWorkBuffers 200
#define kWorkBytes (256u << 10)
#define kExchangeBytes (8u << 20)

static int Check(CUresult r, const char* what, int device) {
  if (r == CUDA_SUCCESS) return 0;
  const char* name = "?";
  cuGetErrorName(r, &name);
  fprintf(stderr, "peer_exchange: %s on device %d failed: %s\n", what, device, name);
  return 1;
}

int main(int argc, char** argv) {
  int n = 0;
  if (Check(cuInit(0), "cuInit", -1) || Check(cuDeviceGetCount(&n), "cuDeviceGetCount", -1)) {
    return 1;
  }
  if (argc > 1) n = atoi(argv[1]) < n ? atoi(argv[1]) : n;
  if (n > kMaxDevices) {
    fprintf(stderr, "peer_exchange: using %d of the %d devices (at most %d)\n", kMaxDevices, n,
            kMaxDevices);
    n = kMaxDevices;
  }
  if (n < 2) {
    printf("peer_exchange: %d device(s); the exchange needs two. Nothing to show here.\n", n);
    return 0;
  }
  CUcontext ctx[kMaxDevices];
  static CUdeviceptr work[kMaxDevices][kWorkBuffers];
  CUdeviceptr exchange[kMaxDevices];
  static unsigned int host[kExchangeBytes / sizeof(unsigned int)];
  for (int d = 0; d < n; ++d) {
    if (Check(cuDevicePrimaryCtxRetain(&ctx[d], d), "cuDevicePrimaryCtxRetain", d) ||
        Check(cuCtxSetCurrent(ctx[d]), "cuCtxSetCurrent", d)) {
      return 1;
    }
    for (int i = 0; i < kWorkBuffers; ++i) {
      if (Check(cuMemAlloc(&work[d][i], kWorkBytes), "cuMemAlloc (working set)", d)) return 1;
    }
    if (Check(cuMemAlloc(&exchange[d], kExchangeBytes), "cuMemAlloc (exchange)", d)) return 1;
    for (size_t k = 0; k < kExchangeBytes / sizeof(unsigned int); ++k) {
      host[k] = (unsigned int)(d * 2654435761u + k);
    }
    if (Check(cuMemcpyHtoD(exchange[d], host, kExchangeBytes), "cuMemcpyHtoD", d)) return 1;
  }
  for (int d = 0; d < n; ++d) {
    if (Check(cuCtxSetCurrent(ctx[d]), "cuCtxSetCurrent", d)) return 1;
    for (int p = 0; p < n; ++p) {
      if (p != d && Check(cuCtxEnablePeerAccess(ctx[p], 0), "cuCtxEnablePeerAccess", d)) {
        return 1;
      }
    }
  }
  unsigned long long sum = 0;
  for (int d = 0; d < n; ++d) {
    const int from = (d + 1) % n;
    if (Check(cuCtxSetCurrent(ctx[d]), "cuCtxSetCurrent", d)) return 1;
    CUresult r = cuMemcpyDtoH(host, exchange[from], kExchangeBytes);
    if (r != CUDA_SUCCESS) {
      const char* name = "?";
      cuGetErrorName(r, &name);
      fprintf(stderr, "peer_exchange: device %d cannot read device %d's exchange buffer: %s\n",
              d, from, name);
      return 1;
    }
    for (size_t k = 0; k < kExchangeBytes / sizeof(unsigned int); ++k) sum += host[k];
  }
  for (int d = 0; d < n; ++d) {
    cuCtxSetCurrent(ctx[d]);
    for (int p = 0; p < n; ++p) {
      if (p != d) cuCtxDisablePeerAccess(ctx[p]);
    }
    for (int i = 0; i < kWorkBuffers; ++i) cuMemFree(work[d][i]);
    cuMemFree(exchange[d]);
    cuDevicePrimaryCtxRelease(d);
  }
  printf("peer_exchange: %d devices, each read its neighbour's %u MiB exchange buffer; "
         "checksum %llu\n", n, kExchangeBytes >> 20, sum);
  return 0;
}

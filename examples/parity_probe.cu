// Prints the return codes and out-parameters of the allocation entry points
// on bad and edge-case input, through the driver API and through cudart.
// Lines starting "PARITY" must be identical with and without the shim; lines
// starting "INFO" show values the shim defines differently on purpose
// (address ranges of packed allocations: docs/architecture.md).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>

#define P(fmt, ...) std::printf("PARITY " fmt "\n", __VA_ARGS__)

int main() {
  cudaFree(nullptr);  // cudart creates and makes current the primary context
  CUdeviceptr p = 0x5a5a5a5a;
  P("cuMemAlloc(NULL, 256) = %d", cuMemAlloc(nullptr, 256));
  CUresult r = cuMemAlloc(&p, 0);
  P("cuMemAlloc(&p, 0) = %d, p %s", r, p == 0x5a5a5a5a ? "unchanged" : p == 0 ? "= 0" : "changed");
  p = 0x5a5a5a5a;
  r = cuMemAlloc(&p, size_t{1} << 50);
  P("cuMemAlloc(&p, 1 PiB) = %d, p %s", r, p == 0x5a5a5a5a ? "unchanged" : p == 0 ? "= 0" : "changed");
  CUdeviceptr ok = 0;
  P("cuMemAlloc(&p, 1 MiB) after OOM = %d", cuMemAlloc(&ok, 1 << 20));
  P("cuMemFree(0) = %d", cuMemFree(0));
  int host_var = 0;
  P("cuMemFree(host pointer) = %d", cuMemFree(reinterpret_cast<CUdeviceptr>(&host_var)));
  P("cuMemFree(interior) = %d", cuMemFree(ok + 256));
  P("cuMemFree(p) = %d", cuMemFree(ok));
  P("cuMemFree(p) again = %d", cuMemFree(ok));
  size_t f = 0, t = 0;
  P("cuMemGetInfo(NULL, NULL) = %d", cuMemGetInfo(nullptr, nullptr));
  P("cuMemGetInfo(&f, NULL) = %d", cuMemGetInfo(&f, nullptr));
  P("cuMemGetInfo(NULL, &t) = %d", cuMemGetInfo(nullptr, &t));
  for (size_t width : {1, 100, 512, 513, 1000, 4097, 65536}) {
    size_t pitch = 0;
    CUdeviceptr q = 0;
    r = cuMemAllocPitch(&q, &pitch, width, 16, 4);
    P("cuMemAllocPitch(width %zu, height 16, 4) = %d, pitch %zu", width, r, pitch);
    if (r == CUDA_SUCCESS) cuMemFree(q);
  }
  size_t pitch = 7;
  CUdeviceptr q = 0x5a5a5a5a;
  r = cuMemAllocPitch(&q, &pitch, size_t{1} << 30, size_t{1} << 22, 4);
  P("cuMemAllocPitch(4 PiB) = %d, p %s, pitch %zu", r,
    q == 0x5a5a5a5a ? "unchanged" : q == 0 ? "= 0" : "changed", pitch);
  P("cuMemAllocPitch(element size 3) = %d", cuMemAllocPitch(&q, &pitch, 100, 4, 3));
  P("cuMemAllocPitch(width 0) = %d", cuMemAllocPitch(&q, &pitch, 0, 4, 4));
  P("cuMemAllocPitch(NULL pitch) = %d", cuMemAllocPitch(&q, nullptr, 100, 4, 4));

  CUdeviceptr a = 0;
  cuMemAlloc(&a, 1000);
  CUdeviceptr base = 0;
  size_t size = 0;
  r = cuMemGetAddressRange(&base, &size, a + 10);
  P("cuMemGetAddressRange(interior) = %d", r);
  std::printf("INFO cuMemGetAddressRange(1000-byte allocation + 10): base %s, size %zu\n",
              base == a ? "= allocation" : "below allocation", size);
  P("cuMemGetAddressRange(host pointer) = %d",
    cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(&host_var)));
  CUcontext ctx = nullptr, owner = nullptr;
  cuCtxGetCurrent(&ctx);
  P("cuPointerGetAttribute(CONTEXT) = %d",
    cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, a));
  P("context is current context: %d", owner == ctx);
  unsigned int type = 0;
  cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a);
  P("memory type %u", type);
  int ordinal = -1;
  cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a);
  P("device ordinal %d", ordinal);
  P("cuPointerGetAttribute(host pointer) = %d",
    cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                          reinterpret_cast<CUdeviceptr>(&host_var)));
  P("cuPointerGetAttribute(NULL data) = %d",
    cuPointerGetAttribute(nullptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a));
  cuMemFree(a);

  // The same through cudart (static): cudaMalloc -> cuMemAlloc_v2, ...
  void* d = reinterpret_cast<void*>(0x5a5a);
  cudaError_t e = cudaMalloc(&d, 0);
  P("cudaMalloc(&d, 0) = %d, d %s", e, d == nullptr ? "= NULL" : "not NULL");
  cudaGetLastError();
  e = cudaMalloc(&d, size_t{1} << 50);
  P("cudaMalloc(1 PiB) = %d", e);
  cudaGetLastError();
  P("cudaMalloc(256) after OOM = %d", cudaMalloc(&d, 256));
  cudaPointerAttributes attr = {};
  P("cudaPointerGetAttributes = %d", cudaPointerGetAttributes(&attr, d));
  P("attributes: type %d device %d devicePointer==d %d", attr.type, attr.device,
    attr.devicePointer == d);
  P("cudaFree(d) = %d", cudaFree(d));
  e = cudaFree(d);
  P("cudaFree(d) again = %d", e);
  cudaGetLastError();
  e = cudaFree(&host_var);
  P("cudaFree(host pointer) = %d", e);
  cudaGetLastError();
  P("cudaFree(NULL) = %d", cudaFree(nullptr));
  size_t pitch2 = 0;
  void* d2 = nullptr;
  P("cudaMallocPitch(1000 x 7) = %d", cudaMallocPitch(&d2, &pitch2, 1000, 7));
  P("cudaMallocPitch pitch %zu", pitch2);
  cudaFree(d2);
  P("cudaMemGetInfo(NULL, NULL) = %d", cudaMemGetInfo(nullptr, nullptr));
  cudaGetLastError();

  // Peer access: where cudaDeviceEnablePeerAccess arrives (cuCtxEnablePeerAccess).
  int devices = 0;
  cudaGetDeviceCount(&devices);
  e = cudaDeviceEnablePeerAccess(0, 0);
  P("cudaDeviceEnablePeerAccess(self) = %d", e);
  cudaGetLastError();
  e = cudaDeviceEnablePeerAccess(devices + 3, 0);
  P("cudaDeviceEnablePeerAccess(no such device) = %d", e);
  cudaGetLastError();
  e = cudaDeviceEnablePeerAccess(0, 7);
  P("cudaDeviceEnablePeerAccess(self, flags 7) = %d", e);
  cudaGetLastError();
  e = cudaDeviceDisablePeerAccess(0);
  P("cudaDeviceDisablePeerAccess(self) = %d", e);
  cudaGetLastError();
  P("cuCtxEnablePeerAccess(current, 0) = %d", cuCtxEnablePeerAccess(ctx, 0));
  P("cuCtxEnablePeerAccess(current, 1) = %d", cuCtxEnablePeerAccess(ctx, 1));
  P("cuCtxEnablePeerAccess(NULL, 0) = %d", cuCtxEnablePeerAccess(nullptr, 0));
  P("cuCtxDisablePeerAccess(current) = %d", cuCtxDisablePeerAccess(ctx));
  P("cuCtxDisablePeerAccess(NULL) = %d", cuCtxDisablePeerAccess(nullptr));
  return 0;
}

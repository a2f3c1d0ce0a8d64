// Prints the return codes and out-parameters of the allocation entry points
// on bad and edge-case input, through the driver API and through cudart.
// Lines starting "PARITY" must be identical with and without the shim; lines
// starting "INFO" show values the shim defines differently on purpose
// (address ranges of packed allocations: docs/architecture.md).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#define P(fmt, ...) std::printf("PARITY " fmt "\n", __VA_ARGS__)

namespace {

const char* CaptureStatusName(CUresult r, CUstreamCaptureStatus s) {
  if (r != CUDA_SUCCESS) return "query failed";
  switch (s) {
    case CU_STREAM_CAPTURE_STATUS_NONE: return "none";
    case CU_STREAM_CAPTURE_STATUS_ACTIVE: return "active";
    case CU_STREAM_CAPTURE_STATUS_INVALIDATED: return "invalidated";
    default: return "?";
  }
}

const char* ModeName(CUstreamCaptureMode mode) {
  switch (mode) {
    case CU_STREAM_CAPTURE_MODE_GLOBAL: return "global";
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: return "thread-local";
    case CU_STREAM_CAPTURE_MODE_RELAXED: return "relaxed";
    default: return "?";
  }
}

// Every allocation and free entry point inside a stream capture, in each
// capture mode, called from the capturing thread and from another thread:
// the call's code, the capture's state right after it, and how the capture
// ends. The driver prohibits "potentially unsafe" calls depending on the
// capture mode (cuThreadExchangeStreamCaptureMode in the driver API
// reference); the shim must give the same codes and leave the capture in the
// same state.
void CaptureRows() {
  const CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
                                       CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                       CU_STREAM_CAPTURE_MODE_RELAXED};
  struct Op {
    const char* name;
    // Runs the call; `live` is a pointer allocated before the capture (freed
    // by the op or afterwards), `s` the capturing stream, `other` an idle one.
    std::function<CUresult(CUdeviceptr live, CUstream s, CUstream other, CUdeviceptr* made)> run;
    size_t live_bytes;  // 0: the op needs no live pointer
  };
  int host_var = 0;
  const CUdeviceptr host = reinterpret_cast<CUdeviceptr>(&host_var);
  // The program's own VMM mapping (not the shim's): what the driver says to
  // cuMemFree of memory it did not make with cuMemAlloc.
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t granularity = 0;
  cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr own_vmm = 0;
  cuMemCreate(&handle, granularity, &prop, 0);
  cuMemAddressReserve(&own_vmm, granularity, 0, 0, 0);
  cuMemMap(own_vmm, granularity, 0, handle, 0);
  CUmemAccessDesc rw = {};
  rw.location = prop.location;
  rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  cuMemSetAccess(own_vmm, granularity, &rw, 1);
  P("cuMemFree(the program's own VMM mapping), no capture = %d", cuMemFree(own_vmm));
  P("cuMemFreeAsync(the program's own VMM mapping), no capture = %d",
    cuMemFreeAsync(own_vmm, nullptr));
  const std::vector<Op> ops = {
      {"cuMemFree(the program's own VMM mapping)",
       [own_vmm](CUdeviceptr, CUstream, CUstream, CUdeviceptr*) { return cuMemFree(own_vmm); }, 0},
      {"cuMemFreeAsync(the program's own VMM mapping, capturing stream)",
       [own_vmm](CUdeviceptr, CUstream s, CUstream, CUdeviceptr*) {
         return cuMemFreeAsync(own_vmm, s); }, 0},
      {"cuMemAlloc(256)", [](CUdeviceptr, CUstream, CUstream, CUdeviceptr* m) {
         return cuMemAlloc(m, 256); }, 0},
      {"cuMemAlloc(4 MiB)", [](CUdeviceptr, CUstream, CUstream, CUdeviceptr* m) {
         return cuMemAlloc(m, 4 << 20); }, 0},
      {"cuMemAlloc(0)", [](CUdeviceptr, CUstream, CUstream, CUdeviceptr* m) {
         return cuMemAlloc(m, 0); }, 0},
      {"cuMemAllocPitch(1000 x 16)", [](CUdeviceptr, CUstream, CUstream, CUdeviceptr* m) {
         size_t pitch = 0;
         return cuMemAllocPitch(m, &pitch, 1000, 16, 4); }, 0},
      {"cuMemFree(256-byte allocation)", [](CUdeviceptr p, CUstream, CUstream, CUdeviceptr*) {
         return cuMemFree(p); }, 256},
      {"cuMemFree(4 MiB allocation)", [](CUdeviceptr p, CUstream, CUstream, CUdeviceptr*) {
         return cuMemFree(p); }, 4 << 20},
      {"cuMemFree(host pointer)", [host](CUdeviceptr, CUstream, CUstream, CUdeviceptr*) {
         return cuMemFree(host); }, 0},
      {"cuMemFree(0)", [](CUdeviceptr, CUstream, CUstream, CUdeviceptr*) {
         return cuMemFree(0); }, 0},
      {"cuMemFreeAsync(256-byte allocation, capturing stream)",
       [](CUdeviceptr p, CUstream s, CUstream, CUdeviceptr*) { return cuMemFreeAsync(p, s); }, 256},
      {"cuMemFreeAsync(4 MiB allocation, capturing stream)",
       [](CUdeviceptr p, CUstream s, CUstream, CUdeviceptr*) { return cuMemFreeAsync(p, s); },
       4 << 20},
      {"cuMemFreeAsync(256-byte allocation, other stream)",
       [](CUdeviceptr p, CUstream, CUstream o, CUdeviceptr*) { return cuMemFreeAsync(p, o); }, 256},
      {"cuMemFreeAsync(host pointer, capturing stream)",
       [host](CUdeviceptr, CUstream s, CUstream, CUdeviceptr*) { return cuMemFreeAsync(host, s); },
       0},
      {"cudaMalloc(256)", [](CUdeviceptr, CUstream, CUstream, CUdeviceptr* m) {
         void* d = nullptr;
         CUresult r = static_cast<CUresult>(cudaMalloc(&d, 256));
         *m = reinterpret_cast<CUdeviceptr>(d);
         cudaGetLastError();
         return r; }, 0},
      {"cudaFree(256-byte allocation)", [](CUdeviceptr p, CUstream, CUstream, CUdeviceptr*) {
         CUresult r = static_cast<CUresult>(cudaFree(reinterpret_cast<void*>(p)));
         cudaGetLastError();
         return r; }, 256},
  };
  CUstream other = nullptr;
  cuStreamCreate(&other, CU_STREAM_NON_BLOCKING);
  for (CUstreamCaptureMode mode : modes) {
    for (const Op& op : ops) {
      for (bool same_thread : {true, false}) {
        CUdeviceptr live = 0;
        if (op.live_bytes != 0 && cuMemAlloc(&live, op.live_bytes) != CUDA_SUCCESS) {
          std::printf("PROBE-ERROR allocation before capture failed\n");
          return;
        }
        CUstream s = nullptr;
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
        CUresult begun = cuStreamBeginCapture(s, mode);
        CUdeviceptr made = 0;
        CUresult r = CUDA_ERROR_UNKNOWN;
        CUstreamCaptureStatus during = CU_STREAM_CAPTURE_STATUS_NONE;
        CUresult queried = CUDA_ERROR_UNKNOWN;
        auto call = [&] {
          r = op.run(live, s, other, &made);
          queried = cuStreamIsCapturing(s, &during);
        };
        if (same_thread) {
          call();
        } else {
          CUcontext ctx = nullptr;
          cuCtxGetCurrent(&ctx);
          std::thread t([&] {
            cuCtxSetCurrent(ctx);
            call();
          });
          t.join();
        }
        CUgraph graph = nullptr;
        CUresult ended = cuStreamEndCapture(s, &graph);
        P("capture %s, %s thread: begin %d, %s = %d, capture then %s, end = %d, graph %s",
          ModeName(mode), same_thread ? "capturing" : "another", begun, op.name, r,
          CaptureStatusName(queried, during), ended, graph != nullptr ? "made" : "none");
        if (graph != nullptr) cuGraphDestroy(graph);
        cudaGetLastError();
        cuStreamSynchronize(s);
        cuStreamDestroy(s);
        if (r == CUDA_SUCCESS && made != 0) cuMemFree(made);
        // A free that failed left the pointer live; one that succeeded made
        // it unknown (freeing it again gives the driver's code, not printed).
        if (live != 0 && r != CUDA_SUCCESS) cuMemFree(live);
      }
    }
  }
  cuStreamDestroy(other);
  cuMemUnmap(own_vmm, granularity);
  cuMemRelease(handle);
  cuMemAddressFree(own_vmm, granularity);
  // A free deferred during a capture must still complete: the memory is
  // usable again once the capture is over.
  CUdeviceptr after = 0;
  P("cuMemAlloc(4 MiB) after the captures = %d", cuMemAlloc(&after, 4 << 20));
  P("cuMemFree of it = %d", cuMemFree(after));
}

// The alignment of cuMemAlloc pointers by size: the lowest set bit of each
// pointer, the minimum over 48 allocations of one size (PARITY; on H200 it
// is the lowest set bit of the size rounded up to 512, core/heap/slab.h), and
// among interleaved sizes (INFO: natively only the 512-byte guarantee; the
// shim keeps each size's alignment there too).
void AlignmentRows() {
  int texture_alignment = 0;
  cuDeviceGetAttribute(&texture_alignment, CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 0);
  P("texture alignment attribute %d", texture_alignment);
  const size_t sizes[] = {1, 100, 256, 257, 500, 512, 513, 768, 1000, 1024, 1025, 1500, 2048,
                          3000, 4096, 5000, 8192, 10000, 16384, 30000, 32768, 50000, 65536,
                          65537, 100000, 131072, 200000, 262144, 500000, 524288, 1000000,
                          1048576, 1048577, 2097152};
  for (size_t size : sizes) {
    std::vector<CUdeviceptr> ptrs(48);
    uint64_t lowest = uint64_t{1} << 40;
    for (CUdeviceptr& p : ptrs) {
      if (cuMemAlloc(&p, size) != CUDA_SUCCESS) p = 0;
      if (p != 0) lowest = std::min<uint64_t>(lowest, p & (~p + 1));
    }
    P("alignment of 48 x cuMemAlloc(%zu): at least %llu", size,
      static_cast<unsigned long long>(lowest));
    for (CUdeviceptr p : ptrs) cuMemFree(p);
  }
  // Mixed sizes, interleaved, as a program allocates.
  const size_t mixed[] = {256, 1000, 1024, 4096, 6000, 65536, 100000, 300};
  std::vector<std::pair<size_t, CUdeviceptr>> live;
  for (int round = 0; round < 32; ++round) {
    for (size_t size : mixed) {
      CUdeviceptr p = 0;
      if (cuMemAlloc(&p, size) == CUDA_SUCCESS) live.push_back({size, p});
    }
  }
  for (size_t size : mixed) {
    uint64_t lowest = uint64_t{1} << 40;
    for (auto& [s, p] : live) {
      if (s == size) lowest = std::min<uint64_t>(lowest, p & (~p + 1));
    }
    std::printf("INFO alignment of cuMemAlloc(%zu) among mixed sizes: at least %llu\n", size,
                static_cast<unsigned long long>(lowest));
  }
  for (auto& [s, p] : live) cuMemFree(p);

  // A texture over a small linear buffer (needs texture alignment) and over
  // a pitched one, each placed after another small allocation.
  void* before = nullptr;
  cudaMalloc(&before, 256);
  void* buf = nullptr;
  cudaMalloc(&buf, 1024);
  cudaResourceDesc res = {};
  res.resType = cudaResourceTypeLinear;
  res.res.linear.devPtr = buf;
  res.res.linear.desc = cudaCreateChannelDesc<float>();
  res.res.linear.sizeInBytes = 1024;
  cudaTextureDesc tex = {};
  tex.readMode = cudaReadModeElementType;
  cudaTextureObject_t object = 0;
  cudaError_t e = cudaCreateTextureObject(&object, &res, &tex, nullptr);
  P("cudaCreateTextureObject(linear, 1 KiB after a 256-byte allocation) = %d", e);
  if (e == cudaSuccess) cudaDestroyTextureObject(object);
  cudaGetLastError();
  void* pitched = nullptr;
  size_t pitch = 0;
  cudaMallocPitch(&pitched, &pitch, 64 * sizeof(float), 8);
  cudaResourceDesc res2 = {};
  res2.resType = cudaResourceTypePitch2D;
  res2.res.pitch2D.devPtr = pitched;
  res2.res.pitch2D.desc = cudaCreateChannelDesc<float>();
  res2.res.pitch2D.width = 64;
  res2.res.pitch2D.height = 8;
  res2.res.pitch2D.pitchInBytes = pitch;
  e = cudaCreateTextureObject(&object, &res2, &tex, nullptr);
  P("cudaCreateTextureObject(pitch 2D, 64 x 8 floats) = %d", e);
  if (e == cudaSuccess) cudaDestroyTextureObject(object);
  cudaGetLastError();
  cudaFree(pitched);
  cudaFree(buf);
  cudaFree(before);
}

}  // namespace

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

  AlignmentRows();
  CaptureRows();
  return 0;
}

// What the driver does with stream-ordered allocations (cuMemAllocAsync and
// the default memory pool), measured before the shim serves them
// (docs/stream-ordered.md). Lines starting "PARITY" must be identical with and
// without the shim; "INFO" lines are figures (latencies, raw values) that may
// differ between runs, or by design under the shim: the pool's reserved bytes
// (the driver reserves 32 MiB at a time, the shim a size class), and the used
// bytes after a cudaFree of stream-ordered memory (the driver keeps counting
// that memory as used; the shim does not).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#define P(fmt, ...) std::printf("PARITY " fmt "\n", __VA_ARGS__)

namespace {

CUmemoryPool g_default = nullptr;

const char* Same(bool same) { return same ? "same" : "different"; }

bool g_used_parity = true;  // false once cudaFree of pool memory skewed the driver's count

void PoolAttributes(const char* when) {
  struct {
    CUmemPool_attribute attr;
    const char* name;
    bool bytes;
  } attrs[] = {
      {CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, "reuse-follow-event-dependencies", false},
      {CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, "reuse-allow-opportunistic", false},
      {CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, "reuse-allow-internal-dependencies",
       false},
      {CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, "release-threshold", true},
      {CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, "reserved-current", true},
      {CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, "reserved-high", true},
      {CU_MEMPOOL_ATTR_USED_MEM_CURRENT, "used-current", true},
      {CU_MEMPOOL_ATTR_USED_MEM_HIGH, "used-high", true},
  };
  for (const auto& a : attrs) {
    if (a.bytes) {
      cuuint64_t v = 0;
      CUresult r = cuMemPoolGetAttribute(g_default, a.attr, &v);
      const bool reserved = a.attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ||
                            a.attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH;
      if (reserved || (!g_used_parity && a.attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)) {
        std::printf("INFO pool %s: %s = %d, %llu\n", when, a.name, r,
                    static_cast<unsigned long long>(v));
      } else {
        P("pool %s: %s = %d, %llu", when, a.name, r, static_cast<unsigned long long>(v));
      }
    } else {
      int v = -1;
      CUresult r = cuMemPoolGetAttribute(g_default, a.attr, &v);
      P("pool %s: %s = %d, %d", when, a.name, r, v);
    }
  }
}

// Keeps a stream busy for about `cycles` clock cycles.
__global__ void Spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

double MedianUs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// `stream_ordered_probe destroyed-stream`: cuMemFreeAsync on a destroyed
// stream, alone in its process (natively it ended the process on H200: the
// call is undefined, the handle may even name a new stream).
int DestroyedStream() {
  cudaFree(nullptr);
  CUstream gone = nullptr;
  cuStreamCreate(&gone, CU_STREAM_NON_BLOCKING);
  CUdeviceptr x = 0;
  cuMemAllocAsync(&x, 256, gone);
  cuStreamSynchronize(gone);
  cuStreamDestroy(gone);
  std::printf("destroyed-stream: freeing on the destroyed stream\n");
  std::fflush(stdout);
  const CUresult r = cuMemFreeAsync(x, gone);
  std::printf("destroyed-stream: cuMemFreeAsync = %d\n", r);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "destroyed-stream") return DestroyedStream();
  cudaFree(nullptr);  // the primary context, current
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  cuCtxGetCurrent(&ctx);
  cuCtxGetDevice(&dev);
  int supported = 0;
  cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev);
  P("memory pools supported %d", supported);
  CUmemoryPool current = nullptr;
  CUresult r = CUDA_SUCCESS;
  P("cuDeviceGetDefaultMemPool = %d", cuDeviceGetDefaultMemPool(&g_default, dev));
  // (Each call is made before its result is printed: the order in which
  // printf's arguments are evaluated is unspecified.)
  r = cuDeviceGetMemPool(&current, dev);
  P("cuDeviceGetMemPool = %d, %s as the default", r, Same(current == g_default));
  CUmemLocation here = {};
  here.type = CU_MEM_LOCATION_TYPE_DEVICE;
  here.id = dev;
  CUmemoryPool by_location = nullptr;
  r = cuMemGetDefaultMemPool(&by_location, &here, CU_MEM_ALLOCATION_TYPE_PINNED);
  P("cuMemGetDefaultMemPool(device location) = %d, %s as cuDeviceGetDefaultMemPool", r,
    Same(by_location == g_default));
  PoolAttributes("at start");

  CUstream s1 = nullptr, s2 = nullptr;
  cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING);
  cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING);

  // Bad input.
  CUdeviceptr p = 0x5a5a;
  P("cuMemAllocAsync(NULL, 256) = %d", cuMemAllocAsync(nullptr, 256, s1));
  r = cuMemAllocAsync(&p, 0, s1);
  P("cuMemAllocAsync(&p, 0) = %d, p %s", r, p == 0x5a5a ? "unchanged" : p == 0 ? "= 0" : "changed");
  p = 0x5a5a;
  r = cuMemAllocAsync(&p, size_t{1} << 50, s1);
  P("cuMemAllocAsync(1 PiB) = %d, p %s", r, p == 0x5a5a ? "unchanged" : p == 0 ? "= 0" : "changed");
  P("cuMemFreeAsync(0) = %d", cuMemFreeAsync(0, s1));
  int host_var = 0;
  P("cuMemFreeAsync(host pointer) = %d",
    cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(&host_var), s1));
  P("cuMemAllocFromPoolAsync(NULL pool) = %d", cuMemAllocFromPoolAsync(&p, 256, nullptr, s1));

  // One allocation: what it is.
  CUdeviceptr a = 0;
  P("cuMemAllocAsync(&a, 1 MiB, s1) = %d", cuMemAllocAsync(&a, 1 << 20, s1));
  CUmemoryPool owner = nullptr;
  r = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a);
  P("cuPointerGetAttribute(MEMPOOL_HANDLE) = %d, %s as the default pool", r,
    Same(owner == g_default));
  unsigned type = 0;
  cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a);
  P("memory type %u", type);
  CUdeviceptr base = 0;
  size_t size = 0;
  r = cuMemGetAddressRange(&base, &size, a + 10);
  std::printf("INFO cuMemGetAddressRange(1 MiB async allocation + 10) = %d: base %s, size %zu\n", r,
              base == a ? "= allocation" : "elsewhere", size);
  cuStreamSynchronize(s1);
  PoolAttributes("with 1 MiB live");
  // Pool memory has no legacy IPC handle.
  int ipc_capable = -1;
  r = cuPointerGetAttribute(&ipc_capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, a);
  P("IS_LEGACY_CUDA_IPC_CAPABLE = %d, %d", r, ipc_capable);
  CUipcMemHandle ipc_handle;
  P("cuIpcGetMemHandle(stream-ordered memory) = %d", cuIpcGetMemHandle(&ipc_handle, a));
  P("cuMemFreeAsync(a, s1) = %d", cuMemFreeAsync(a, s1));
  P("cuMemFreeAsync(a, s1) again = %d", cuMemFreeAsync(a, s1));
  cuStreamSynchronize(s1);
  PoolAttributes("after the free");

  // Reuse rules. The release threshold is raised for them: with 0, the
  // pool gives freed memory back at every synchronize, and whether a later
  // allocation lands at the same address says nothing about reuse.
  cuuint64_t keep_all = ~cuuint64_t{0};
  cuMemPoolSetAttribute(g_default, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all);
  CUdeviceptr x = 0, y = 0;
  cuMemAllocAsync(&x, 4 << 20, s1);
  cuMemFreeAsync(x, s1);
  cuMemAllocAsync(&y, 4 << 20, s1);
  P("reuse on the same stream, no synchronize: %s", Same(x == y));
  CUdeviceptr z = 0, w = 0;
  Spin<<<1, 1, 0, reinterpret_cast<cudaStream_t>(s1)>>>(200000000);  // ~0.1 s of work on s1
  cuMemFreeAsync(y, s1);  // ordered after the work: not yet done
  cuMemAllocAsync(&z, 4 << 20, s2);
  P("reuse on another stream while the freeing stream is busy: %s", Same(y == z));
  cuCtxSynchronize();
  cuMemAllocAsync(&w, 4 << 20, s2);  // z is still live
  P("reuse on another stream after the freeing stream's work is done: %s", Same(y == w));
  cuMemFreeAsync(z, s2);
  cuMemFreeAsync(w, s2);
  cuStreamSynchronize(s2);
  cuuint64_t zero = 0;
  cuMemPoolSetAttribute(g_default, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero);
  cuMemPoolTrimTo(g_default, 0);

  // cudaFree of stream-ordered memory, cudaFreeAsync of cudaMalloc memory.
  void* d = nullptr;
  cudaMallocAsync(&d, 256, reinterpret_cast<cudaStream_t>(s1));
  cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s1));
  cudaError_t e = cudaFree(d);
  P("cudaFree(stream-ordered memory) = %d", e);
  cuuint64_t used = 0;
  cuMemPoolGetAttribute(g_default, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
  std::printf("INFO pool used bytes after that cudaFree: %llu\n",
              static_cast<unsigned long long>(used));
  g_used_parity = false;
  cudaGetLastError();
  e = cudaFree(d);
  P("cudaFree(it) again = %d", e);
  cudaGetLastError();
  void* m = nullptr;
  cudaMalloc(&m, 256);
  e = cudaFreeAsync(m, reinterpret_cast<cudaStream_t>(s1));
  P("cudaFreeAsync(cudaMalloc memory) = %d", e);
  cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s1));
  e = cudaFree(m);
  P("cudaFree(it) afterwards = %d", e);
  cudaGetLastError();

  // Memory allocated on a stream that is then destroyed, freed on another.
  CUstream gone = nullptr;
  cuStreamCreate(&gone, CU_STREAM_NON_BLOCKING);
  cuMemAllocAsync(&x, 256, gone);
  cuStreamSynchronize(gone);
  cuStreamDestroy(gone);
  cuMemFreeAsync(x, s1);
  cuStreamSynchronize(s1);
  cuMemPoolGetAttribute(g_default, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
  std::printf("INFO pool used bytes after freeing it on another stream: %llu\n",
              static_cast<unsigned long long>(used));

  // Pool access: the owner, a peer that does not exist, bad descriptors.
  CUmemLocation loc = {};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  r = cuMemPoolGetAccess(&flags, g_default, &loc);
  P("cuMemPoolGetAccess(owner) = %d, flags %d", r, flags);
  int devices = 0;
  cuDeviceGetCount(&devices);
  loc.id = devices;
  P("cuMemPoolGetAccess(no such device) = %d", cuMemPoolGetAccess(&flags, g_default, &loc));
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = dev;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  P("cuMemPoolSetAccess(owner, read-write) = %d", cuMemPoolSetAccess(g_default, &desc, 1));
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  P("cuMemPoolSetAccess(owner, none) = %d", cuMemPoolSetAccess(g_default, &desc, 1));
  desc.location.id = devices;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  P("cuMemPoolSetAccess(no such device) = %d", cuMemPoolSetAccess(g_default, &desc, 1));
  P("cuMemPoolSetAccess(count 0) = %d", cuMemPoolSetAccess(g_default, &desc, 0));
  P("cuMemPoolSetAccess(NULL, 1) = %d", cuMemPoolSetAccess(g_default, nullptr, 1));

  // Alignment of stream-ordered pointers by size.
  for (size_t bytes : {size_t{1}, size_t{256}, size_t{1000}, size_t{4096}, size_t{65536},
                       size_t{1} << 20, (size_t{2} << 20) + 1}) {
    std::vector<CUdeviceptr> v(48);
    uint64_t lowest = uint64_t{1} << 40;
    for (CUdeviceptr& q : v) {
      if (cuMemAllocAsync(&q, bytes, s1) != CUDA_SUCCESS) q = 0;
      if (q != 0) lowest = std::min<uint64_t>(lowest, q & (~q + 1));
    }
    std::printf("INFO alignment of 48 x cuMemAllocAsync(%zu): at least %llu\n", bytes,
                static_cast<unsigned long long>(lowest));
    for (CUdeviceptr q : v) cuMemFreeAsync(q, s1);
  }
  cuStreamSynchronize(s1);

  // cuMemGetInfo with 1 GiB of stream-ordered memory live, and the trim.
  size_t free_before = 0, free_with = 0, free_after = 0, total = 0;
  cuMemGetInfo(&free_before, &total);
  CUdeviceptr big = 0;
  cuMemAllocAsync(&big, size_t{1} << 30, s1);
  cuStreamSynchronize(s1);
  cuMemGetInfo(&free_with, &total);
  P("cuMemGetInfo counts 1 GiB of stream-ordered memory: %s",
    free_before - free_with >= (size_t{1} << 30) ? "yes" : "no");
  cuMemFreeAsync(big, s1);
  cuStreamSynchronize(s1);
  cuMemGetInfo(&free_after, &total);
  std::printf("INFO free memory: %zu MiB before, %zu MiB with 1 GiB live, %zu MiB after its "
              "free (kept by the pool below the release threshold)\n",
              free_before >> 20, free_with >> 20, free_after >> 20);
  PoolAttributes("after 1 GiB freed");
  P("cuMemPoolTrimTo(0) = %d", cuMemPoolTrimTo(g_default, 0));
  PoolAttributes("after the trim");

  // A stream-ordered allocation during stream capture: a graph memory node.
  for (CUstreamCaptureMode mode : {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED}) {
    cuStreamBeginCapture(s2, mode);
    CUdeviceptr g = 0;
    r = cuMemAllocAsync(&g, 1 << 20, s2);
    CUresult fr = cuMemFreeAsync(g, s2);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuStreamIsCapturing(s2, &st);
    CUgraph graph = nullptr;
    CUresult ended = cuStreamEndCapture(s2, &graph);
    size_t nodes = 0;
    if (graph != nullptr) cuGraphGetNodes(graph, nullptr, &nodes);
    P("capture %s: cuMemAllocAsync = %d, cuMemFreeAsync = %d, capture %d, end = %d, %zu nodes",
      mode == CU_STREAM_CAPTURE_MODE_GLOBAL ? "global" : "relaxed", r, fr, st, ended, nodes);
    if (graph != nullptr) cuGraphDestroy(graph);
  }

  // A pool made current with cuDeviceSetMemPool.
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  CUmemoryPool mine = nullptr;
  P("cuMemPoolCreate = %d", cuMemPoolCreate(&mine, &props));
  P("cuDeviceSetMemPool(created) = %d", cuDeviceSetMemPool(dev, mine));
  cuDeviceGetMemPool(&current, dev);
  P("current pool is the created one: %s", Same(current == mine));
  cuMemAllocAsync(&x, 256, s1);
  cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, x);
  P("an allocation then comes from the created pool: %s", Same(owner == mine));
  cuMemFreeAsync(x, s1);
  cuStreamSynchronize(s1);
  cuDeviceSetMemPool(dev, g_default);
  P("cuMemPoolDestroy = %d", cuMemPoolDestroy(mine));

  // Latency, native figures for the targets (medians of 2,000 pairs after warm-up).
  for (bool two_streams : {false, true}) {
    for (size_t bytes : {size_t{256}, size_t{1} << 20, size_t{64} << 20}) {
      std::vector<double> us;
      for (int i = 0; i < 2200; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        cuMemAllocAsync(&x, bytes, s1);
        cuMemFreeAsync(x, two_streams ? s2 : s1);
        auto t1 = std::chrono::steady_clock::now();
        if (i >= 200) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        if (two_streams && i % 64 == 0) cuCtxSynchronize();
      }
      cuCtxSynchronize();
      std::printf("INFO alloc+free pair, %s, %zu bytes: median %.2f us\n",
                  two_streams ? "freed on another stream" : "one stream", bytes, MedianUs(us));
    }
  }
  cuStreamDestroy(s1);
  cuStreamDestroy(s2);
  return 0;
}

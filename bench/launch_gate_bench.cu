// The launch path's cost: what a kernel launch and a small copy cost on the
// host, natively and under the shim (whose submission gate sits in these
// calls). With a resident set of live allocations (256 cudaMalloc of mixed
// sizes, kept alive) and after a warm-up, each measure is BATCHES batches
// of BATCH calls on one stream, each batch timed on the host from its first
// call to the end of a cudaStreamSynchronize (the calls are the bottleneck:
// an empty kernel or a 4 KiB copy takes the GPU less than the call takes
// the host), and the median batch's time per call is printed. The same
// batches' time to the return of the last call (before the synchronize) is
// printed as NAME_enqueue_ns.
//   launch_ns                  an empty __global__ function, <<<1, 1>>>
//   memcpy_d2d_4k_ns           cudaMemcpyAsync of 4 KiB, device to device
//                              (between two resident allocations)
//   memcpy_h2d_pinned_4k_ns    cudaMemcpyAsync of 4 KiB from pinned host
//                              memory (cudaMallocHost) to the device
//   memcpy_d2d_4k_vmm_ns       cudaMemcpyAsync of 4 KiB, device to device,
//                              between two buffers the program maps itself
//                              with the driver's VMM calls (cuMemCreate,
//                              cuMemMap), natively and under the shim: the
//                              same kind of memory either way, so its
//                              shim/native isolates the shim's own cost on a
//                              copy, and its native figure against
//                              memcpy_d2d_4k's native one shows what the
//                              driver charges a copy between VMM mappings
// Output: "# ..." lines (the setup), then one "NAME VALUE" line per measure,
// VALUE in nanoseconds per call. Linked with the static cudart (nvcc's
// default), so the shim sees the calls at the driver boundary.
// tools/gpu/launch-gate-bench.sh runs it natively and under the shim,
// alternated, and prints the side-by-side table.
// usage: launch_gate_bench [--batches N (20)] [--batch N (10000)]
//                          [--resident N (256)] [--device D (0)]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../examples/cuda_check.h"

namespace {


__global__ void Empty() {}

constexpr size_t kCopyBytes = 4096;

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Result {
  double per_call_ns;  // to the end of the synchronize
  double enqueue_ns;   // to the return of the last call
};

// BATCHES batches of BATCH calls of op(), after one batch of warm-up.
template <typename Op>
Result Measure(cudaStream_t s, int batches, int batch, Op op) {
  for (int i = 0; i < batch; ++i) op();
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaGetLastError());
  std::vector<double> total, enqueue;
  for (int b = 0; b < batches; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) op();
    const auto t1 = std::chrono::steady_clock::now();
    CHECK_CUDA(cudaStreamSynchronize(s));
    const auto t2 = std::chrono::steady_clock::now();
    CHECK_CUDA(cudaGetLastError());
    total.push_back(Seconds(t0, t2) * 1e9 / batch);
    enqueue.push_back(Seconds(t0, t1) * 1e9 / batch);
  }
  return {Median(total), Median(enqueue)};
}

int ArgInt(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

#define CHECK_CU(call)                                                                 \
  do {                                                                                 \
    const CUresult r_ = (call);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                          \
      const char* s_ = nullptr;                                                        \
      cuGetErrorName(r_, &s_);                                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_ ? s_ : "?"); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// One granularity-sized buffer the program maps itself with the VMM calls
// (CUDA Programming Guide, "Virtual Memory Management"): create, reserve,
// map, grant the device read/write.
struct VmmBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
};

VmmBuffer MapVmmBuffer(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  VmmBuffer b;
  CHECK_CU(cuMemGetAllocationGranularity(&b.bytes, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK_CU(cuMemCreate(&b.handle, b.bytes, &prop, 0));
  CHECK_CU(cuMemAddressReserve(&b.ptr, b.bytes, 0, 0, 0));
  CHECK_CU(cuMemMap(b.ptr, b.bytes, 0, b.handle, 0));
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(cuMemSetAccess(b.ptr, b.bytes, &access, 1));
  return b;
}

void UnmapVmmBuffer(const VmmBuffer& b) {
  CHECK_CU(cuMemUnmap(b.ptr, b.bytes));
  CHECK_CU(cuMemAddressFree(b.ptr, b.bytes));
  CHECK_CU(cuMemRelease(b.handle));
}

}  // namespace

int main(int argc, char** argv) {
  const int batches = ArgInt(argc, argv, "--batches", 20);
  const int batch = ArgInt(argc, argv, "--batch", 10000);
  const int resident = std::max(2, ArgInt(argc, argv, "--resident", 256));
  const int device = ArgInt(argc, argv, "--device", 0);
  if (batches < 1 || batch < 1) {
    std::fprintf(stderr, "usage: launch_gate_bench [--batches N] [--batch N] [--resident N] "
                         "[--device D]\n");
    return 2;
  }
  CHECK_CUDA(cudaSetDevice(device));
  CHECK_CUDA(cudaFree(nullptr));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  int driver = 0, runtime = 0;
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  CHECK_CUDA(cudaRuntimeGetVersion(&runtime));

  // The resident set: mixed sizes from 4 KiB to 16 MiB and some odd ones,
  // from a fixed sequence, every one touched once.
  std::vector<void*> live;
  size_t resident_bytes = 0;
  unsigned state = 12345;
  for (int i = 0; i < resident; ++i) {
    state = state * 1103515245u + 12345u;
    const size_t sizes[] = {4096, 65536, 1 << 20, (2 << 20) + 4096, 8 << 20, 16 << 20, 512 << 10,
                            12288 + 512};
    const size_t bytes = sizes[(state >> 16) % 8];
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemset(p, i & 0xff, bytes));
    live.push_back(p);
    resident_bytes += bytes;
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // The copies run between two allocations in the middle of the set.
  void* src = live[resident / 3];
  void* dst = live[(2 * resident) / 3];
  void* host = nullptr;
  CHECK_CUDA(cudaMallocHost(&host, kCopyBytes));
  std::memset(host, 7, kCopyBytes);
  const VmmBuffer vmm_src = MapVmmBuffer(device);
  const VmmBuffer vmm_dst = MapVmmBuffer(device);
  CHECK_CUDA(cudaMemset(reinterpret_cast<void*>(vmm_src.ptr), 3, vmm_src.bytes));
  CHECK_CUDA(cudaDeviceSynchronize());

  std::printf("# device %d: %s, driver %d, runtime %d\n", device, prop.name, driver, runtime);
  std::printf("# resident set: %d allocations, %zu bytes; %d batches of %d calls, median "
              "batch, ns per call\n",
              resident, resident_bytes, batches, batch);
  std::fflush(stdout);

  auto print = [](const char* name, const Result& r) {
    std::printf("%s_ns %.1f\n%s_enqueue_ns %.1f\n", name, r.per_call_ns, name, r.enqueue_ns);
    std::fflush(stdout);
  };
  print("launch", Measure(s, batches, batch, [&] { Empty<<<1, 1, 0, s>>>(); }));
  print("memcpy_d2d_4k", Measure(s, batches, batch, [&] {
          CHECK_CUDA(cudaMemcpyAsync(dst, src, kCopyBytes, cudaMemcpyDeviceToDevice, s));
        }));
  print("memcpy_h2d_pinned_4k", Measure(s, batches, batch, [&] {
          CHECK_CUDA(cudaMemcpyAsync(dst, host, kCopyBytes, cudaMemcpyHostToDevice, s));
        }));
  print("memcpy_d2d_4k_vmm", Measure(s, batches, batch, [&] {
          CHECK_CUDA(cudaMemcpyAsync(reinterpret_cast<void*>(vmm_dst.ptr),
                                     reinterpret_cast<void*>(vmm_src.ptr), kCopyBytes,
                                     cudaMemcpyDeviceToDevice, s));
        }));

  CHECK_CUDA(cudaStreamDestroy(s));
  UnmapVmmBuffer(vmm_src);
  UnmapVmmBuffer(vmm_dst);
  CHECK_CUDA(cudaFreeHost(host));
  for (void* p : live) CHECK_CUDA(cudaFree(p));
  return 0;
}

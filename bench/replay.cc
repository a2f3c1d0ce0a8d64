// Replays an allocation trace (VMMSHIM_TRACE_FILE, core/report/trace.h): every alloc
// and free in recorded order, on device 0, one thread, timing each call.
// bench/run_replay.sh runs it natively and under the shim; output rows as
// alloc_bench's: label,metric,bytes,threads,median_us,p99_us,value.
//   replay TRACE.csv [--label NAME]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef BENCH_DRIVER_API
#include <cuda.h>
namespace {
bool Init() {
  CUdevice dev;
  CUcontext ctx;
  return cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
         cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
}
bool Malloc(void** p, size_t n) {
  CUdeviceptr d;
  if (cuMemAlloc(&d, n) != CUDA_SUCCESS) return false;
  *p = reinterpret_cast<void*>(d);
  return true;
}
bool Free(void* p) { return cuMemFree(reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS; }
}  // namespace
#else
#include <cuda_runtime.h>
namespace {
bool Init() { return cudaFree(nullptr) == cudaSuccess; }
bool Malloc(void** p, size_t n) { return cudaMalloc(p, n) == cudaSuccess; }
bool Free(void* p) { return cudaFree(p) == cudaSuccess; }
}  // namespace
#endif

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: replay TRACE.csv [--label NAME]\n");
    return 2;
  }
  std::string label = "run";
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--label") == 0) label = argv[i + 1];
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "replay: cannot open %s\n", argv[1]);
    return 1;
  }
  struct Op {
    bool alloc;
    size_t bytes;
    std::string ptr;
  };
  std::vector<Op> ops;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string f[6];
    for (auto& x : f) std::getline(ss, x, ',');
    if (f[3] != "alloc" && f[3] != "free") continue;
    ops.push_back({f[3] == "alloc", std::stoull(f[4]), f[5]});
  }
  if (!Init()) {
    std::fprintf(stderr, "replay: no usable CUDA device\n");
    return 1;
  }
  std::unordered_map<std::string, void*> live;
  std::vector<double> alloc_us, free_us;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (const Op& op : ops) {
    const auto t0 = Clock::now();
    if (op.alloc) {
      void* p = nullptr;
      if (!Malloc(&p, op.bytes)) {
        std::fprintf(stderr, "replay: allocation of %zu bytes failed\n", op.bytes);
        return 1;
      }
      alloc_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      live[op.ptr] = p;
    } else {
      auto it = live.find(op.ptr);
      if (it == live.end()) continue;  // allocated before the trace started
      Free(it->second);
      free_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      live.erase(it);
    }
  }
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  for (auto& [k, p] : live) Free(p);
  auto summary = [&](const char* metric, std::vector<double> v) {
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    std::printf("%s,%s,0,1,%.3f,%.3f,%zu\n", label.c_str(), metric, v[v.size() / 2],
                v[std::min(v.size() - 1, v.size() * 99 / 100)], v.size());
  };
  std::printf("label,metric,bytes,threads,median_us,p99_us,value\n");
  summary("replay_malloc", alloc_us);
  summary("replay_free", free_us);
  std::printf("%s,replay_total_ms,0,1,0,0,%.3f\n", label.c_str(), total_ms);
  return 0;
}

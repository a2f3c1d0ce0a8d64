#include "cli/compare/device_memory.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

namespace vmmshim::compare {
namespace {

// The few NVML types used, as the NVML API reference defines them
// (nvml.h is not part of the CUDA Toolkit's default install).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlProcessInfo_t {  // nvmlProcessInfo_v2_t, taken by the _v3 query
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

}  // namespace

struct DeviceMemorySampler::Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*) = nullptr;
  std::vector<nvmlDevice_t> devices;
  ~Nvml() {
    if (shutdown != nullptr) shutdown();
    if (lib != nullptr) dlclose(lib);
  }
};

DeviceMemorySampler::DeviceMemorySampler() {
  auto nvml = std::make_unique<Nvml>();
  nvml->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml->lib == nullptr) {
    unavailable_ = "libnvidia-ml.so.1 cannot be loaded (no NVIDIA driver)";
    return;
  }
  auto init = reinterpret_cast<nvmlReturn_t (*)()>(dlsym(nvml->lib, "nvmlInit_v2"));
  auto count = reinterpret_cast<nvmlReturn_t (*)(unsigned int*)>(
      dlsym(nvml->lib, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<nvmlReturn_t (*)(unsigned int, nvmlDevice_t*)>(
      dlsym(nvml->lib, "nvmlDeviceGetHandleByIndex_v2"));
  nvml->memory_info = reinterpret_cast<decltype(nvml->memory_info)>(
      dlsym(nvml->lib, "nvmlDeviceGetMemoryInfo"));
  nvml->processes = reinterpret_cast<decltype(nvml->processes)>(
      dlsym(nvml->lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
  if (init == nullptr || count == nullptr || handle == nullptr ||
      nvml->memory_info == nullptr || nvml->processes == nullptr) {
    unavailable_ = "libnvidia-ml.so.1 lacks nvmlDeviceGetComputeRunningProcesses_v3 (driver "
                   "older than 510)";
    return;
  }
  if (nvmlReturn_t r = init(); r != kNvmlSuccess) {
    unavailable_ = "nvmlInit_v2 failed (NVML error " + std::to_string(r) + ")";
    return;
  }
  nvml->shutdown = reinterpret_cast<nvmlReturn_t (*)()>(dlsym(nvml->lib, "nvmlShutdown"));
  unsigned int n = 0;
  if (count(&n) != kNvmlSuccess || n == 0) {
    unavailable_ = "NVML sees no device";
    return;
  }
  for (unsigned int i = 0; i < n; ++i) {
    nvmlDevice_t d;
    if (handle(i, &d) == kNvmlSuccess) nvml->devices.push_back(d);
  }
  nvml_ = std::move(nvml);
}

DeviceMemorySampler::~DeviceMemorySampler() = default;

void DeviceMemorySampler::Begin() {
  peak_process_ = peak_device_ = 0;
  sampled_ = process_seen_ = false;
  used_before_.clear();
  if (!nvml_) return;
  for (nvmlDevice_t d : nvml_->devices) {
    nvmlMemory_t m{};
    used_before_.push_back(nvml_->memory_info(d, &m) == kNvmlSuccess ? m.used : 0);
  }
}

void DeviceMemorySampler::Sample(pid_t root) {
  if (!nvml_) return;
  uint64_t process_sum = 0, device_sum = 0;
  std::vector<nvmlProcessInfo_t> infos(64);
  for (size_t i = 0; i < nvml_->devices.size(); ++i) {
    nvmlDevice_t d = nvml_->devices[i];
    nvmlMemory_t m{};
    if (nvml_->memory_info(d, &m) == kNvmlSuccess && i < used_before_.size() &&
        m.used > used_before_[i]) {
      device_sum += m.used - used_before_[i];
    }
    unsigned int n = static_cast<unsigned int>(infos.size());
    nvmlReturn_t r = nvml_->processes(d, &n, infos.data());
    if (r == kNvmlInsufficientSize) {
      infos.resize(n + 16);
      n = static_cast<unsigned int>(infos.size());
      r = nvml_->processes(d, &n, infos.data());
    }
    if (r != kNvmlSuccess) continue;
    for (unsigned int k = 0; k < n; ++k) {
      if (!DescendsFrom(static_cast<pid_t>(infos[k].pid), root)) continue;
      process_seen_ = true;
      // NVML_VALUE_NOT_AVAILABLE (all ones) where the driver cannot say.
      if (infos[k].usedGpuMemory != ~0ull) process_sum += infos[k].usedGpuMemory;
    }
  }
  sampled_ = true;
  peak_process_ = std::max(peak_process_, process_sum);
  peak_device_ = std::max(peak_device_, device_sum);
}

std::optional<uint64_t> DeviceMemorySampler::Peak() const {
  if (!sampled_) return std::nullopt;
  return process_seen_ ? peak_process_ : peak_device_;
}

bool DescendsFrom(pid_t pid, pid_t root) {
  for (int depth = 0; depth < 64 && pid > 1; ++depth) {
    if (pid == root) return true;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) return false;
    char state;
    int ppid;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) != 2) return false;
    pid = ppid;
  }
  return false;
}

}  // namespace vmmshim::compare

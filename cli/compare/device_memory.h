// Peak device memory of a running program, sampled through NVML (the NVIDIA
// Management Library, libnvidia-ml.so.1, loaded with dlopen so that
// `vmmshim compare` runs where there is no driver, as on the simulated one).
//
// What is measured, in bytes: every NVIDIA device's memory used by the
// program's processes (the pid given and every process descended from it),
// as nvmlDeviceGetComputeRunningProcesses reports it (context, kernels and
// allocations together, as nvidia-smi shows them), added up over devices, at
// the largest sample. Where NVML reports no process of the program (a
// container whose pid namespace NVML does not see), the device's used memory
// (nvmlDeviceGetMemoryInfo) above its level before the run is taken instead,
// and Source() says so: other processes on those devices then count too.
// Samples are taken when Sample is called (every 10 ms by RunChild), so a
// peak shorter than that may be missed.
//
// NVML reference: docs.nvidia.com/deploy/nvml-api (Device Queries,
// nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetMemoryInfo).
//
// Thread safety: none; one sampler per run, used from one thread.
#ifndef VMMSHIM_CLI_COMPARE_DEVICE_MEMORY_H_
#define VMMSHIM_CLI_COMPARE_DEVICE_MEMORY_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace vmmshim::compare {

class DeviceMemorySampler {
 public:
  // Loads and initializes NVML once. When it cannot, Available() is false
  // and Unavailable() says why ("libnvidia-ml.so.1 not found").
  DeviceMemorySampler();
  ~DeviceMemorySampler();
  DeviceMemorySampler(const DeviceMemorySampler&) = delete;
  DeviceMemorySampler& operator=(const DeviceMemorySampler&) = delete;

  bool Available() const { return nvml_ != nullptr; }
  const std::string& Unavailable() const { return unavailable_; }

  // Starts a run: forgets the last peak and records the devices' used
  // memory now.
  void Begin();
  // One sample of the processes descended from `root`.
  void Sample(pid_t root);
  // The peak of this run, or nullopt when nothing was sampled.
  std::optional<uint64_t> Peak() const;
  // "process" (per-process figures) or "device" (used memory minus the level
  // before the run), for the last run.
  std::string Source() const { return process_seen_ ? "process" : "device"; }

 private:
  struct Nvml;
  std::unique_ptr<Nvml> nvml_;
  std::string unavailable_;
  std::vector<uint64_t> used_before_;
  uint64_t peak_process_ = 0, peak_device_ = 0;
  bool sampled_ = false, process_seen_ = false;
};

// Whether `pid` is `root` or descends from it (/proc/PID/stat's ppid chain).
bool DescendsFrom(pid_t pid, pid_t root);

}  // namespace vmmshim::compare

#endif  // VMMSHIM_CLI_COMPARE_DEVICE_MEMORY_H_

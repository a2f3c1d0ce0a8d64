// What the control socket (core/control/control_server.h) asks of a process
// under the shim, answered by the rooms that own it: the residency
// (core/report/residency.h), the deep sleep and wake
// (core/sleep/sleep_coordinator.h), the bytes paused (core/heap/pause.h) and
// the memory mapped from other processes (core/ipc/ipc.h).
//
// Thread safety: any thread (each room's own). Everything referenced must
// outlive it; the shim never destroys it.
#ifndef VMMSHIM_CORE_CONTROL_PROCESS_CONTROL_H_
#define VMMSHIM_CORE_CONTROL_PROCESS_CONTROL_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/control/control_server.h"
#include "core/driver/driver_api.h"
#include "core/heap/pause.h"
#include "core/ipc/ipc.h"
#include "core/memory_control.h"
#include "core/sleep/sleep_coordinator.h"

namespace vmmshim {

class ProcessControl : public ControlTarget {
 public:
  // `driver`: asked for each device's used memory in the residency (the
  // real entry points, uncounted). `ipc`: nullptr when VMMSHIM_IPC=0.
  ProcessControl(const DriverApi& driver, const MemoryControl& control,
                 const PauseCoordinator& pause, SleepCoordinator& sleeper, const Ipc* ipc)
      : driver_(driver), control_(control), pause_(pause), sleeper_(sleeper), ipc_(ipc) {}

  std::string ResidencyJson() const override;
  absl::StatusOr<size_t> Sleep(const std::vector<std::string>& drop) override;
  absl::StatusOr<size_t> Wake() override;
  size_t PausedBytes() const override;
  std::string SharedMemory() const override;

 private:
  const DriverApi& driver_;
  const MemoryControl& control_;
  const PauseCoordinator& pause_;
  SleepCoordinator& sleeper_;
  const Ipc* const ipc_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_CONTROL_PROCESS_CONTROL_H_

#include "core/control/process_control.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/report/residency.h"

namespace vmmshim {

std::string ProcessControl::ResidencyJson() const {
  return vmmshim::ResidencyJson(control_, &driver_);
}

absl::StatusOr<size_t> ProcessControl::Sleep(const std::vector<std::string>& drop) {
  return sleeper_.Sleep(drop);
}

absl::StatusOr<size_t> ProcessControl::Wake() { return sleeper_.Wake(); }

size_t ProcessControl::PausedBytes() const { return pause_.paused_bytes(); }

std::string ProcessControl::SharedMemory() const {
  if (ipc_ == nullptr) return "";
  const Ipc::OpenImports open = ipc_->open_imports();
  if (open.bytes == 0) return "";
  return absl::StrCat("the process maps ", open.bytes, " bytes of device memory that ",
                      open.exporters.size() == 1 ? "process " : "processes ",
                      absl::StrJoin(open.exporters, ", "),
                      " exported (cudaIpcOpenMemHandle); close it (cudaIpcCloseMemHandle) "
                      "before the sleep");
}

}  // namespace vmmshim

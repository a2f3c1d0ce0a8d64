// Inside core/report: the residency report's "devices" and
// "host_memory_for_pauses" arrays as JSON values (core/report/residency.h
// states their contents), for ResidencyJson and the statistics file, so that
// neither serializes them to parse them again.
#ifndef VMMSHIM_CORE_REPORT_RESIDENCY_DEVICES_H_
#define VMMSHIM_CORE_REPORT_RESIDENCY_DEVICES_H_

#include "core/memory_control.h"
#include "core/driver/driver_api.h"
#include "nlohmann/json.hpp"

namespace vmmshim {

// `driver` nullptr: the shim's own figures only (ResidencyJson's contract).
nlohmann::json ResidencyDevices(const MemoryControl& control, const DriverApi* driver);
nlohmann::json HostMemoryForPausesJson(const MemoryControl& control);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_REPORT_RESIDENCY_DEVICES_H_

// Inside core/report: the residency report's "devices" array as a JSON value
// (core/report/residency.h states its contents), for ResidencyJson and the
// statistics file, so that neither serializes it to parse it again.
#ifndef VMMSHIM_CORE_REPORT_RESIDENCY_DEVICES_H_
#define VMMSHIM_CORE_REPORT_RESIDENCY_DEVICES_H_

#include "core/memory_control.h"
#include "core/driver/driver_api.h"
#include "nlohmann/json.hpp"

namespace vmmshim {

// `driver` nullptr: the shim's own figures only (ResidencyJson's contract).
nlohmann::json ResidencyDevices(const MemoryControl& control, const DriverApi* driver);

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_REPORT_RESIDENCY_DEVICES_H_

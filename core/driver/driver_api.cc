#include "core/driver/driver_api.h"

#include "absl/strings/str_cat.h"

namespace vmmshim {

const char* DriverApi::NameOf(const void* fn) const {
  if (fn == nullptr) return nullptr;
#define VMMSHIM_MATCH_ENTRY(member, symbol, type, required) \
  if (reinterpret_cast<const void*>(member) == fn) return symbol;
  VMMSHIM_DRIVER_ENTRY_POINTS(VMMSHIM_MATCH_ENTRY)
#undef VMMSHIM_MATCH_ENTRY
  return nullptr;
}

DriverApi LoadDriverApi(void* handle, SymbolLookup lookup) {
  DriverApi api;
#define VMMSHIM_LOAD_ENTRY(member, symbol, type, required) \
  api.member = reinterpret_cast<type>(lookup(handle, symbol));
  VMMSHIM_DRIVER_ENTRY_POINTS(VMMSHIM_LOAD_ENTRY)
#undef VMMSHIM_LOAD_ENTRY
  return api;
}

absl::Status CheckRequired(const DriverApi& api) {
#define VMMSHIM_CHECK_ENTRY(member, symbol, type, required)                     \
  if ((required) && api.member == nullptr) {                                    \
    return absl::NotFoundError(absl::StrCat(                                    \
        "libcuda.so.1 lacks required entry point ", symbol,                     \
        " (a driver older than CUDA 11.3?)"));                                   \
  }
  VMMSHIM_DRIVER_ENTRY_POINTS(VMMSHIM_CHECK_ENTRY)
#undef VMMSHIM_CHECK_ENTRY
  return absl::OkStatus();
}

}  // namespace vmmshim

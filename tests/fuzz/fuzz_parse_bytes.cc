// libFuzzer target: the byte-count parser. A parsed value must round-trip for
// plain digits and never overflow silently.
#include <cstdint>
#include <string>

#include "config/rules_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::optional<size_t> v = vmmshim::ParseBytes(text);
  if (v && !text.empty() && text.find_first_not_of("0123456789") == std::string::npos &&
      std::to_string(*v) != text.substr(text.find_first_not_of('0') == std::string::npos
                                            ? text.size() - 1
                                            : text.find_first_not_of('0'))) {
    __builtin_trap();
  }
  return 0;
}

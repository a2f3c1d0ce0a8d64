// Figures as `vmmshim report` and `vmmshim compare` print them.
// Thread safety: pure functions.
#ifndef VMMSHIM_CLI_FORMAT_H_
#define VMMSHIM_CLI_FORMAT_H_

#include <cstdint>
#include <string>

namespace vmmshim::cli {

// "120.0 us", "12.3 ms", "1.52 s".
std::string FormatSeconds(double seconds);

// "512 B", "1.5 KiB", "4.00 MiB", "1.50 GiB" (powers of 1024).
std::string FormatBytes(uint64_t bytes);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_FORMAT_H_

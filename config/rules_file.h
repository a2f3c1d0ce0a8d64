// The peer-access rules file (VMMSHIM_CONFIG), TOML read with cpptoml.
//
//   # The first rule that matches an (allocation, peer) pair decides.
//   default = "deny"            # when no rule matches: "allow" or "deny"
//
//   [[rule]]
//   owner = 0                   # owner device; omitted = any
//   peer = [1, 2]               # peer device or list; omitted = any
//   min_size = "1MiB"           # inclusive; bytes or K/M/G/T[iB]; omitted = 0
//   max_size = "1GiB"           # inclusive; omitted = no limit
//   tag = "kv-cache"            # allocation tag (vmmshim_set_allocation_tag);
//                               # "" matches untagged allocations only
//   action = "allow"            # required: "allow" or "deny" (any case)
//
// A rule naming a device the machine does not have never matches.
//
// Every problem (syntax, unknown key, wrong type, bad size, missing action)
// is reported as "FILE:LINE: problem".
#ifndef VMMSHIM_CONFIG_RULES_FILE_H_
#define VMMSHIM_CONFIG_RULES_FILE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/peer/policy/peer_policy.h"

namespace vmmshim {

// Parses a byte count: digits, optionally followed by B, or by K, M, G or T
// each optionally followed by "iB" or "B" (all powers of 1024; any case,
// spaces allowed before the unit): "1048576", "512B", "1M", "1 MiB", "2g".
// nullopt when malformed or out of range.
std::optional<size_t> ParseBytes(absl::string_view text);

// Reads a rules file into a PeerPolicy of kind kRules.
absl::StatusOr<PeerPolicy> LoadRulesFile(const std::string& path);

}  // namespace vmmshim

#endif  // VMMSHIM_CONFIG_RULES_FILE_H_

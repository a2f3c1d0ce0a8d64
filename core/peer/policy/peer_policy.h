// Which peer devices may access an allocation: the per-allocation policy.
//
// `cudaDeviceEnablePeerAccess` maps every allocation of a device into the
// peer. vmmshim instead asks a PeerPolicy, for each allocation and each peer,
// whether the peer may map it (CUDA Programming Guide 4.16: access to VMM
// memory is granted per mapping with cuMemSetAccess). A grant takes effect
// when the peer has enabled peer access to the owner (cuCtxEnablePeerAccess)
// or when the program grants it explicitly (include/vmmshim/vmmshim.h).
//
// Kinds:
//   kAll      every allocation (what cudaDeviceEnablePeerAccess does; default)
//   kNone     no allocation
//   kMinSize  allocations of at least `min_bytes` bytes
//   kRules    ordered rules (owner, peer, size range, tag); the first match
//             decides; `default_allow` when none matches
//
// Thread safety: an immutable value after construction; Allows() is const.
#ifndef VMMSHIM_CORE_PEER_POLICY_PEER_POLICY_H_
#define VMMSHIM_CORE_PEER_POLICY_PEER_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/base/device_set.h"

namespace vmmshim {

struct PeerRule {
  std::optional<int> owner;        // nullopt: any owner device
  std::vector<int> peers;          // empty: any peer device
  size_t min_bytes = 0;            // inclusive
  size_t max_bytes = std::numeric_limits<size_t>::max();  // inclusive
  std::optional<std::string> tag;  // nullopt: any tag (also untagged)
  bool allow = true;
  int line = 0;                    // where the rule starts in its file, for logs

  bool Matches(int owner_device, int peer_device, size_t bytes, absl::string_view tag) const;
};

struct PeerPolicy {
  enum class Kind { kAll, kNone, kMinSize, kRules };

  Kind kind = Kind::kAll;
  size_t min_bytes = 0;           // kMinSize
  std::vector<PeerRule> rules;    // kRules, in order
  bool default_allow = false;     // kRules: when no rule matches
  std::string rules_file;         // kRules: where the rules came from

  // May `peer_device` map an allocation of `bytes` on `owner_device`
  // carrying `tag` ("" = untagged)? The owner itself is always allowed.
  bool Allows(int owner_device, int peer_device, size_t bytes, absl::string_view tag) const;

  // The devices among [0, device_count) that may map such an allocation,
  // the owner included (device_count is clamped to kMaxDevices).
  DeviceSet Allowed(int owner_device, int device_count, size_t bytes,
                    absl::string_view tag) const;

  // For kAll and kNone the allowed set does not depend on size or tag: that
  // set, so that the allocator need not ask per allocation; nullopt for
  // kMinSize and kRules.
  std::optional<DeviceSet> ConstantAllowed(int owner_device, int device_count) const;

  // One line for the log: "all", "min-size 1048576 bytes", "rules from
  // FILE: 3 rules, default deny".
  std::string Describe() const;

  // Why `peer` is denied (for denial log lines), e.g. "below min-size
  // 1048576 bytes" or "rule at FILE:12".
  std::string DenialReason(int owner_device, int peer_device, size_t bytes,
                           absl::string_view tag) const;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_PEER_POLICY_PEER_POLICY_H_

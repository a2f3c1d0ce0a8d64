#include "core/peer/policy/peer_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace vmmshim {

bool PeerRule::Matches(int owner_device, int peer_device, size_t bytes,
                       absl::string_view allocation_tag) const {
  if (owner && *owner != owner_device) return false;
  if (!peers.empty() && std::find(peers.begin(), peers.end(), peer_device) == peers.end()) {
    return false;
  }
  if (bytes < min_bytes || bytes > max_bytes) return false;
  if (tag && *tag != allocation_tag) return false;
  return true;
}

bool PeerPolicy::Allows(int owner_device, int peer_device, size_t bytes,
                        absl::string_view tag) const {
  if (owner_device == peer_device) return true;
  switch (kind) {
    case Kind::kAll:
      return true;
    case Kind::kNone:
      return false;
    case Kind::kMinSize:
      return bytes >= min_bytes;
    case Kind::kRules:
      for (const PeerRule& rule : rules) {
        if (rule.Matches(owner_device, peer_device, bytes, tag)) return rule.allow;
      }
      return default_allow;
  }
  return false;
}

DeviceSet PeerPolicy::Allowed(int owner_device, int device_count, size_t bytes,
                              absl::string_view tag) const {
  if (std::optional<DeviceSet> constant = ConstantAllowed(owner_device, device_count)) {
    return *constant;
  }
  DeviceSet allowed;
  for (int d = 0; d < device_count && d < kMaxDevices; ++d) {
    if (Allows(owner_device, d, bytes, tag)) allowed.Add(d);
  }
  return allowed;
}

std::optional<DeviceSet> PeerPolicy::ConstantAllowed(int owner_device, int device_count) const {
  switch (kind) {
    case Kind::kAll: return DeviceSet::FirstN(device_count) | DeviceSet::Of(owner_device);
    case Kind::kNone: return DeviceSet::Of(owner_device);
    default: return std::nullopt;
  }
}

std::string PeerPolicy::Describe() const {
  switch (kind) {
    case Kind::kAll:
      return "all (every allocation is granted to peers that enable access)";
    case Kind::kNone:
      return "none (no allocation is granted to peers)";
    case Kind::kMinSize:
      return absl::StrCat("min-size (allocations of at least ", min_bytes,
                          " bytes are granted to peers)");
    case Kind::kRules:
      return absl::StrCat("rules from ", rules_file, " (", rules.size(), " rules, default ",
                          default_allow ? "allow" : "deny", ")");
  }
  return "?";
}

std::string PeerPolicy::DenialReason(int owner_device, int peer_device, size_t bytes,
                                     absl::string_view tag) const {
  switch (kind) {
    case Kind::kNone:
      return "policy none";
    case Kind::kMinSize:
      return absl::StrCat("below min-size ", min_bytes, " bytes");
    case Kind::kRules:
      for (const PeerRule& rule : rules) {
        if (rule.Matches(owner_device, peer_device, bytes, tag)) {
          return absl::StrCat("rule at ", rules_file, ":", rule.line);
        }
      }
      return absl::StrCat("default of ", rules_file);
    case Kind::kAll:
      break;
  }
  return "not denied";
}

}  // namespace vmmshim

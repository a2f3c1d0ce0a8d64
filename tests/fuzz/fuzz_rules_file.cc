// libFuzzer target: the TOML rules file parser (config/rules_file.h) on any
// bytes. It must return a policy or an error naming FILE:LINE, never crash,
// hang or throw.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "config/rules_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/vmmshim_fuzz_rules_" + std::to_string(getpid()) + ".toml";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  absl::StatusOr<vmmshim::PeerPolicy> policy = vmmshim::LoadRulesFile(path);
  if (policy.ok()) {
    for (int owner = 0; owner < 4; ++owner) {
      (void)policy->Allowed(owner, 4, size, "kv");
      (void)policy->DenialReason(owner, (owner + 1) % 4, size, "");
    }
  } else if (policy.status().message().find(path) == absl::string_view::npos) {
    __builtin_trap();  // every problem names the file
  }
  return 0;
}

// libFuzzer target: ParseConfig over arbitrary VMMSHIM_* variables. Input:
// lines "NAME=VALUE"; it must never crash, and every problem is one line.
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> env;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    env["VMMSHIM_" + line.substr(0, eq)] = line.substr(eq + 1);
  }
  std::vector<std::string> names;
  for (const auto& [k, v] : env) names.push_back(k);
  vmmshim::ParseResult r = vmmshim::ParseConfig(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      names, 1234);
  for (const auto* list : {&r.problems, &r.fatal_problems}) {
    for (const std::string& p : *list) {
      if (p.empty()) __builtin_trap();
    }
  }
  return 0;
}

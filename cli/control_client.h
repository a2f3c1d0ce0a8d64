#ifndef VMMSHIM_CLI_CONTROL_CLIENT_H_
#define VMMSHIM_CLI_CONTROL_CLIENT_H_

// The client side of a process's control socket
// (core/control/control_server.h): one JSON request, one JSON reply.

#include <string>

#include "nlohmann/json.hpp"

namespace vmmshim::cli {

// DIR/ctl-PID.sock; `dir` empty: the default directory.
std::string ControlSocketPath(const std::string& dir, int pid);

// The process's reply to `request`, or null when nobody answers within
// `seconds` (no socket, a process that died or stalls).
nlohmann::json AskProcess(const std::string& socket_path, const nlohmann::json& request,
                          int seconds);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_CONTROL_CLIENT_H_

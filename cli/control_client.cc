#include "cli/control_client.h"

#include <unistd.h>

#include "core/base/unix_socket.h"

namespace vmmshim::cli {

std::string ControlSocketPath(const std::string& dir, int pid) {
  return (dir.empty() ? DefaultSocketDirectory() : dir) + "/ctl-" + std::to_string(pid) +
         ".sock";
}

nlohmann::json AskProcess(const std::string& socket_path, const nlohmann::json& request,
                          int seconds) {
  const int fd = ConnectTo(socket_path, seconds);
  if (fd < 0) return nullptr;
  const std::string line = request.dump() + "\n";
  std::string reply;
  if (WriteAll(fd, line.data(), line.size())) {
    char c;
    while (ReadAll(fd, &c, 1) && c != '\n') reply.push_back(c);
  }
  close(fd);
  nlohmann::json parsed = nlohmann::json::parse(reply, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return nullptr;
  return parsed;
}

}  // namespace vmmshim::cli

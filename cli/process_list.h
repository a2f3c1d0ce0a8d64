#ifndef VMMSHIM_CLI_PROCESS_LIST_H_
#define VMMSHIM_CLI_PROCESS_LIST_H_

// `vmmshim ps [--json] [--dir DIR]`: the processes of this user running
// under the shim, found by their control sockets (DIR/ctl-PID.sock: DIR is
// VMMSHIM_IPC_DIR, default /tmp/vmmshim-<euid>; core/control/control_server.h),
// each asked what it holds (1-second timeout): pid, state, the device memory
// it uses (cuMemGetInfo's view, summed over devices), what the shim holds
// resident and paused, the tags paused, and its command line. A socket
// whose process is gone is removed; a process that does not answer is
// listed as "not answering". --json: one JSON array of the processes'
// replies (each with "pid" and "command").
//
// Writes to stdout; a directory that cannot be read is one line on stderr.
// Returns 0, or 1 when the directory cannot be read.

#include <string>

namespace vmmshim::cli {

int PsCommand(const std::string& dir, bool json);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_PROCESS_LIST_H_

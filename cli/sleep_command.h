#ifndef VMMSHIM_CLI_SLEEP_COMMAND_H_
#define VMMSHIM_CLI_SLEEP_COMMAND_H_

// `vmmshim sleep PID... [--drop TAG]...` and `vmmshim wake PID...`: a whole
// process's deep sleep (docs/deep-sleep.md), this program being the external
// controller the driver's checkpoint API wants. Several PIDs (a job's ranks)
// sleep as one step: every process is checked before any is paused, every
// one pauses before any is locked, and a failure anywhere brings every one
// back to running.
//
// The control socket of each PID is found and checked as
// cli/control_client.h says (the directory and the peer: an impostor is
// refused before anything is sent); root may sleep and wake another user's
// process.
//
// sleep: refused, with nothing paused, when a PID is given twice, a --drop
// tag is over 255 bytes or held by none of the processes (naming the tags
// they hold), PID has no control socket in DIR
// (not under the shim, not this user's, or not yet a CUDA process), is not
// running (sleeping or asleep already), has memory paused of its own, or the
// driver lacks cuCheckpointProcess* (a CUDA 12.8 driver, r570, or later) or
// says the process is not running. Then: the process pauses everything the
// shim holds (the --drop tags without their contents), the driver locks it
// (CUDA calls block from then on; 10-second timeout) and checkpoints what is
// left, context included. A failure after the pause is undone (unlock if
// locked, then resume): the process is never left half asleep.
//
// wake [--onto OLD=NEW]...: the driver restores the process (when
// checkpointed; onto other GPUs of the same chip by UUID pairs, which must
// name every GPU the process had, as the driver's restore requires; checked
// for form before anything is done) and unlocks it
// (when locked), then the process resumes everything. A helper killed while
// the process slept leaves it checkpointed or locked: wake finishes the job.
// Refused when the process is running, unless the driver still holds it
// (locked or checkpointed: a helper killed between its lock and the
// process's resume), which is then restored and unlocked.
//
// Prints one line of what was done and its times; errors name the problem on
// stderr. Returns 0 on success, 1 otherwise.

#include <string>
#include <vector>

namespace vmmshim::cli {

int SleepCommand(const std::vector<int>& pids, const std::vector<std::string>& drop,
                 const std::string& dir);
int WakeCommand(const std::vector<int>& pids, const std::vector<std::string>& onto,
                const std::string& dir);

}  // namespace vmmshim::cli

#endif  // VMMSHIM_CLI_SLEEP_COMMAND_H_

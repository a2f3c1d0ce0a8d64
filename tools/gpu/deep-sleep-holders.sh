#!/usr/bin/env bash
# What the driver's process checkpoint may not take, on a GPU host (after
# tools/gpu/bundle.sh): examples/deep_sleep_holders.py holding a one-rank
# NCCL group, or memory exported with cudaIpcGetMemHandle, under the shim:
# `vmmshim sleep PID`, the MiB nvidia-smi lists for it asleep, `vmmshim wake
# PID`, the result before and after (equal when nothing was lost). A sleep
# that is refused must say why, leave nothing paused (the result after equal,
# the process still running) and the process's memory where it was. The
# one-rank NCCL process is also put to sleep by the driver's checkpoint alone
# (tools/gpu/driver_checkpoint.py), natively, for comparison. Then two
# processes of one job (--holds pair: a parent that shared a tensor with a
# child that maps it): `vmmshim sleep CHILD`, then `vmmshim sleep PARENT
# CHILD` (the job as one step), each to be refused naming why, neither
# process paused, both results equal before and after.
# Writes $OUT/deep-sleep-holders.log.
# usage: tools/gpu/deep-sleep-holders.sh
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/deep-sleep-holders.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
run() {  # HOLDS native|shim
  local holds=$1 how=$2 pid before after awake asleep s w rc
  coproc H { if [ "$how" = native ]; then exec python3 "$root/examples/deep_sleep_holders.py" --holds "$holds";
             else LD_PRELOAD=$shim exec python3 "$root/examples/deep_sleep_holders.py" --holds "$holds"; fi; }
  read -r -t 180 line <&"${H[0]}"; pid=${line#ready }
  echo result >&"${H[1]}"; read -r -t 60 before <&"${H[0]}"
  awake=$(held "$pid")
  if [ "$how" = native ]; then
    s=$(python3 "$root/tools/gpu/driver_checkpoint.py" sleep "$pid" 2>&1); rc=$?
  else
    s=$("$b/vmmshim" sleep "$pid" 2>&1); rc=$?
  fi
  asleep=$(held "$pid")
  if [ $rc = 0 ]; then
    if [ "$how" = native ]; then w=$(python3 "$root/tools/gpu/driver_checkpoint.py" wake "$pid" 2>&1)
    else w=$("$b/vmmshim" wake "$pid" 2>&1); fi
  else
    w="(refused: not woken); vmmshim ps: $("$b/vmmshim" ps 2>&1 | grep -w "$pid" | tr -s ' ')"
  fi
  echo result >&"${H[1]}"; read -r -t 120 after <&"${H[0]}"
  echo quit >&"${H[1]}"; wait "$H_PID" 2>/dev/null
  echo "$holds ($how): MiB awake $awake, asleep/after the refusal $asleep; sleep (rc $rc): $s; wake: $w"
  echo "  before: $before"; echo "  after:  $after"
  [ -n "$before" ] && [ "$before" = "$after" ] && echo "  identical" || echo "  DIFFERS"
}
pair() {
  local line pid cpid before after tries
  coproc P { LD_PRELOAD=$shim exec python3 "$root/examples/deep_sleep_holders.py" --holds pair; }
  read -r -t 300 line <&"${P[0]}"; read -r pid cpid <<< "${line#ready }"
  echo result >&"${P[1]}"; read -r -t 60 before <&"${P[0]}"
  echo "pair (shim): parent $pid MiB $(held "$pid"), child $cpid MiB $(held "$cpid")"
  for tries in "$cpid" "$pid $cpid"; do
    # shellcheck disable=SC2086
    s=$("$b/vmmshim" sleep $tries 2>&1); rc=$?
    echo "  vmmshim sleep $tries (rc $rc): $s"
  done
  echo "  after the refusals: parent MiB $(held "$pid"), child MiB $(held "$cpid"); vmmshim ps:"
  "$b/vmmshim" ps 2>&1 | grep -wE "PID|$pid|$cpid" | sed 's/^/    /'
  echo result >&"${P[1]}"; read -r -t 60 after <&"${P[0]}"
  echo quit >&"${P[1]}"; wait "$P_PID" 2>/dev/null
  echo "  before: $before"; echo "  after:  $after"
  [ -n "$before" ] && [ "$before" = "$after" ] && echo "  identical" || echo "  DIFFERS"
}
run nccl native
run nccl shim
run exported shim
pair

#!/usr/bin/env bash
# Runs history_app under the shim on the simulated driver with a snapshot file, then checks
# the three snapshots it leaves (at exit, on demand while paused, at the out-of-memory
# failure) with check_snapshot.py.
# usage: memory_history.sh HISTORY_APP   (LD_PRELOAD and LD_LIBRARY_PATH set by ctest)
set -euo pipefail
app=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
status=0
env SIMCUDA_DEVICES=2 SIMCUDA_MEMORY_MIB=256 VMMSHIM_PEER_POLICY=min-size \
  VMMSHIM_PEER_MIN_BYTES=1M VMMSHIM_SNAPSHOT_FILE="$dir/snap.pickle" VMMSHIM_LOG_LEVEL=info \
  "$app" "$dir/paused.pickle" >"$dir/out" 2>"$dir/err" || status=$?
cat "$dir/out" "$dir/err"
[ "$status" -eq 0 ] || { echo "history_app exited with $status"; exit 1; }
python3 "$here/check_snapshot.py" "$dir/out" "$dir/err" "$dir/snap.pickle" \
  "$dir/paused.pickle" "$dir/snap.oom.pickle"

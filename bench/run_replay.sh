#!/usr/bin/env bash
# Replays a recorded allocation trace natively and under the shim, one after
# the other, and prints one table (bench/report.py).
# usage: bench/run_replay.sh [--simulated] REPLAY_BINARY LIBVMMSHIM TRACE OUTDIR
set -euo pipefail
sim=()
[ "${1:-}" = --simulated ] && { sim=(--simulated); shift; }
bin=$1 shim=$2 trace=$3 out=$4
mkdir -p "$out"
"$bin" "$trace" --label native > "$out/native.csv"
LD_PRELOAD=$shim "$bin" "$trace" --label shim > "$out/shim.csv"
python3 "$(dirname "$0")/report.py" "$out/native.csv" "$out/shim.csv" "$out" "${sim[@]}"

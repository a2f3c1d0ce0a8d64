#!/usr/bin/env bash
# What the submission gate adds to a work-submitting call, on this CPU and
# the simulated driver: bench/gated_call_cost natively and under the shim,
# alternated, ROUNDS times each (default 3); prints each run's figures and
# the medians side by side. No GPU needed (the GPU launch path:
# tools/gpu/launch-gate-bench.sh).
# usage: bench/gated_call_cost.sh BUILD_DIR [ROUNDS]
set -euo pipefail
build=${1:?usage: gated_call_cost.sh BUILD_DIR [ROUNDS]} rounds=${2:-3}
bin=$build/bench/gated_call_cost
export LD_LIBRARY_PATH=$build/simcuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} SIMCUDA_DEVICES=1
native=() shim=()
for ((r = 1; r <= rounds; r++)); do
  n=$("$bin" | awk '{s += $2} END {printf "%.1f", s / NR}')
  s=$(LD_PRELOAD=$build/libvmmshim.so "$bin" | awk '{s += $2} END {printf "%.1f", s / NR}')
  echo "round $r: native $n ns, shim $s ns per call"
  native+=("$n") shim+=("$s")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
mn=$(median "${native[@]}") ms=$(median "${shim[@]}")
awk -v n="$mn" -v s="$ms" 'BEGIN {printf "median: native %.1f ns, shim %.1f ns per call: the gate adds %.1f ns\n", n, s, s - n}'

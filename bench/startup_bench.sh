#!/usr/bin/env bash
# Start-up cost of the preload for a process that never touches CUDA:
# PROGRAM (default /bin/true) run natively and under LD_PRELOAD=LIB, the two
# alternating, RUNS times each after WARMUP uncounted runs of each; prints the
# median wall time of each (fork + exec + exit + wait, timed by bash's
# $EPOCHREALTIME, so no timer process runs in between) and their ratio.
# usage: bench/startup_bench.sh LIB [RUNS [PROGRAM...]]   (default 500, /bin/true)
set -euo pipefail
lib=$(realpath "$1")
runs=${2:-500}
shift $(( $# >= 2 ? 2 : 1 ))
prog=("${@:-/bin/true}")
warmup=${WARMUP:-50}
[ -f "$lib" ] || { echo "no such library: $lib" >&2; exit 2; }
unset LD_PRELOAD

once() {  # once native|preload: sets dt, in microseconds
  local t0 t1
  if [ "$1" = native ]; then
    t0=$EPOCHREALTIME; "${prog[@]}" >/dev/null; t1=$EPOCHREALTIME
  else
    t0=$EPOCHREALTIME; LD_PRELOAD=$lib "${prog[@]}" >/dev/null; t1=$EPOCHREALTIME
  fi
  dt=$(( 10#${t1/./} - 10#${t0/./} ))
}
median() { sort -n | awk '{v[NR] = $1} END {m = int((NR + 1) / 2); print (NR % 2) ? v[m] : (v[m] + v[m + 1]) / 2}'; }

for ((i = 0; i < warmup; i++)); do once native; once preload; done
native=() preload=()
for ((i = 0; i < runs; i++)); do
  once native; native+=("$dt")
  once preload; preload+=("$dt")
done
n=$(printf '%s\n' "${native[@]}" | median)
p=$(printf '%s\n' "${preload[@]}" | median)
awk -v n="$n" -v p="$p" -v runs="$runs" -v prog="${prog[*]}" -v lib="$lib" 'BEGIN {
  printf "%s, median of %d runs each (alternating, after warm-up):\n", prog, runs
  printf "  native:                     %7.3f ms\n", n / 1000
  printf "  LD_PRELOAD=%s: %7.3f ms\n", lib, p / 1000
  printf "  ratio: %.2fx\n", p / n
}'

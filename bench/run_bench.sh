#!/usr/bin/env bash
# Runs the allocation benchmark natively and under LD_PRELOAD=libvmmshim.so
# in this one invocation, alternating native and shim for N rounds (and a
# baseline shim build, when given, in the same rotation), and prints one
# table (shim / native per row, targets marked, medians over the rounds),
# results.csv and chart.png (with matplotlib) in OUTDIR; with several rounds
# also each round's figures and their spread (bench/compare.py). Before the
# counted rounds, each variant runs --warmup times (default 1) uncounted, in
# the same order, so that no counted run is the first of its kind on the
# machine (driver, page cache and GPU clocks in their working state).
# usage: bench/run_bench.sh [--quick] [--simulated] [--rounds N] [--warmup N] [--baseline LIB]
#                           [--only GROUPS]
#                           BENCH_BINARY LIBVMMSHIM OUTDIR
set -euo pipefail
quick=() only=() simulated=0 rounds=1 warmup=1 baseline=""
while [[ ${1:-} == --* ]]; do
  case $1 in
    --quick) quick=(--quick) ;;
    --simulated) simulated=1 ;;
    --rounds) rounds=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --baseline) baseline=$2; shift ;;
    --only) only=(--only "$2"); shift ;;
  esac
  shift
done
bin=$1 shim=$2 out=$3
mkdir -p "$out"
here=$(dirname "$0")
native_csv=() shim_csv=() base_csv=()
for ((i = 1; i <= warmup; i++)); do
  "$bin" "${quick[@]}" "${only[@]}" --label native > /dev/null
  [ -n "$baseline" ] && LD_PRELOAD=$baseline "$bin" "${quick[@]}" "${only[@]}" --label baseline > /dev/null
  LD_PRELOAD=$shim "$bin" "${quick[@]}" "${only[@]}" --label shim > /dev/null
done
for ((i = 1; i <= rounds; i++)); do
  "$bin" "${quick[@]}" "${only[@]}" --label native > "$out/native-$i.csv"
  native_csv+=("$out/native-$i.csv")
  if [ -n "$baseline" ]; then
    LD_PRELOAD=$baseline "$bin" "${quick[@]}" "${only[@]}" --label baseline > "$out/baseline-$i.csv"
    base_csv+=("$out/baseline-$i.csv")
  fi
  LD_PRELOAD=$shim "$bin" "${quick[@]}" "${only[@]}" --label shim > "$out/shim-$i.csv"
  shim_csv+=("$out/shim-$i.csv")
done
join() { local IFS=,; echo "$*"; }
labels=("native=$(join "${native_csv[@]}")" "shim=$(join "${shim_csv[@]}")")
[ -n "$baseline" ] && labels+=("baseline=$(join "${base_csv[@]}")")
if [ "$rounds" -gt 1 ] || [ -n "$baseline" ]; then
  python3 "$here/compare.py" "$out" "${labels[@]}"
  cp "$out/native-merged.csv" "$out/native.csv"
  cp "$out/shim-merged.csv" "$out/shim.csv"
else
  cp "$out/native-1.csv" "$out/native.csv"
  cp "$out/shim-1.csv" "$out/shim.csv"
fi
args=("$out/native.csv" "$out/shim.csv" "$out")
[ $simulated = 1 ] && args+=(--simulated)
python3 "$here/report.py" "${args[@]}"

#!/usr/bin/env bash
# Runs the allocation benchmark natively and under LD_PRELOAD=libvmmshim.so,
# one after the other in this one invocation, and prints one table (shim /
# native per row, targets marked), results.csv and chart.png (with
# matplotlib) in OUTDIR.
# usage: bench/run_bench.sh [--quick] [--simulated] BENCH_BINARY LIBVMMSHIM OUTDIR
set -euo pipefail
quick=() simulated=0
while [[ ${1:-} == --* ]]; do
  case $1 in
    --quick) quick=(--quick) ;;
    --simulated) simulated=1 ;;
  esac
  shift
done
bin=$1 shim=$2 out=$3
mkdir -p "$out"
"$bin" "${quick[@]}" --label native > "$out/native.csv"
LD_PRELOAD=$shim "$bin" "${quick[@]}" --label shim > "$out/shim.csv"
args=("$out/native.csv" "$out/shim.csv" "$out")
[ $simulated = 1 ] && args+=(--simulated)
python3 "$(dirname "$0")/report.py" "${args[@]}"

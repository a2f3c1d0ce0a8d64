#!/usr/bin/env bash
# vmmshim next to its closest peer, torch_memory_saver (preload mode: it
# serves cudaMalloc from VMM inside its regions), and native, in one call on
# a GPU host (after tools/gpu/bundle.sh and tools/gpu/fetch-wheels.sh):
#   - examples/cupy_nopool.py   CuPy with its pool off (2,000 iterations);
#   - examples/cudart_loop      a cudart malloc/free loop with a resident set;
#   - examples/torch_step_time.py  a PyTorch training step (median of 200).
# The three modes alternate, ROUNDS times each (default 3); each program
# warms up before it measures. torch_memory_saver is entered in its region
# by the programs themselves (examples/tms_region.py, tms_set_interesting_
# region in cudart_loop), on the main thread, as its region() does.
# Writes $OUT/tms-compare.csv (one row per run) and prints medians and
# ratios against native.
# usage: tools/gpu/compare-tms.sh [ROUNDS]
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
rounds=${1:-3}
unpack_tms
if [ -z "$tms_dir" ]; then
  echo "no torch_memory_saver wheel in .gpu/wheels (run tools/gpu/fetch-wheels.sh)"; exit 1
fi
csv=$out/tms-compare.csv
echo "workload,mode,round,value,unit,checksum" > "$csv"
run() {  # workload mode round command...
  local workload=$1 mode=$2 round=$3; shift 3
  local preload=""
  [ "$mode" = vmmshim ] && preload=$shim
  [ "$mode" = torch_memory_saver ] && preload=$tms
  local line
  line=$(LD_PRELOAD=$preload "$@" 2>&1 | grep -E "^(cupy_nopool|cudart_loop|torch_step_time):" | tail -1)
  echo "$mode round $round: $line"
  local value checksum unit
  case $workload in
    cupy_nopool) value=$(sed -E 's/.*: ([0-9.]+) ms.*/\1/' <<<"$line"); unit=ms
                 checksum=$(sed -E 's/.*checksum (.*)/\1/' <<<"$line") ;;
    cudart_loop) value=$(sed -E 's/.*: ([0-9.]+) ms.*/\1/' <<<"$line"); unit=ms
                 checksum=$(sed -E 's/.*checksum (.*)/\1/' <<<"$line") ;;
    torch_step)  value=$(sed -E 's/.*median ([0-9.]+) ms.*/\1/' <<<"$line"); unit=ms_per_step
                 checksum="" ;;
  esac
  [[ $value =~ ^[0-9.]+$ ]] || value=FAILED
  echo "$workload,$mode,$round,$value,$unit,$checksum" >> "$csv"
}
for workload in cupy_nopool cudart_loop torch_step; do
  echo "== $workload"
  for ((i = 1; i <= rounds; i++)); do
    for mode in native vmmshim torch_memory_saver; do
      case $workload in
        cupy_nopool) run $workload $mode $i python3 "$root/examples/cupy_nopool.py" ;;
        cudart_loop) run $workload $mode $i "$b/examples/cudart_loop" ;;
        torch_step)  run $workload $mode $i python3 "$root/examples/torch_step_time.py" ;;
      esac
    done
  done
done
python3 - "$csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| workload | native | vmmshim | torch_memory_saver | vmmshim/native | tms/native | same checksum |")
print("|---|---|---|---|---|---|---|")
for w in ("cupy_nopool", "cudart_loop", "torch_step"):
    med, sums = {}, set()
    for m in ("native", "vmmshim", "torch_memory_saver"):
        v = [float(r["value"]) for r in rows if r["workload"] == w and r["mode"] == m and r["value"] != "FAILED"]
        med[m] = statistics.median(v) if v else float("nan")
        sums |= {r["checksum"] for r in rows if r["workload"] == w and r["mode"] == m and r["checksum"]}
    unit = next((r["unit"] for r in rows if r["workload"] == w), "")
    n = med["native"]
    print(f"| {w} ({unit}, median) | {n:.3f} | {med['vmmshim']:.3f} | {med['torch_memory_saver']:.3f} | "
          f"{med['vmmshim'] / n:.3f} | {med['torch_memory_saver'] / n:.3f} | "
          f"{'yes' if len(sums) <= 1 else 'NO: ' + ' / '.join(sorted(sums))} |")
PY
rm -rf "$tms_dir"

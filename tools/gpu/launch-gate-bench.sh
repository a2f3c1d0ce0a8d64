#!/usr/bin/env bash
# The launch path's cost under the shim, on a GPU host after
# tools/gpu/bundle.sh: bench/launch_gate_bench (an empty-kernel launch, 4 KiB
# cudaMemcpyAsync device to device and pinned host to device, with 256 live
# allocations; the median batch's ns per call) natively and under
# LD_PRELOAD=libvmmshim.so, alternated (native, shim, native, shim, ...),
# RUNS times each (default 5, at least 3: on an H100 one run's launch figure
# varied by 15% between runs of the same program). Prints every run's figures, then
# one row per measure: the median of the native runs, the median of the
# shim runs, and shim/native in %. Exits nonzero when a run failed.
# Writes $OUT/launch-gate-bench.log.
# usage: tools/gpu/launch-gate-bench.sh [RUNS]
#   BENCH_ARGS="--batches 20 --batch 10000 --resident 256" (the program's
#   defaults) are passed to each run; RUN_TIMEOUT (default 300) bounds each.
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/launch-gate-bench.log") 2>&1
runs=${1:-${RUNS:-5}}
[ "$runs" -ge 3 ] 2>/dev/null || { echo "RUNS must be 3 or more (got $runs)"; exit 2; }
bin=$b/bench/launch_gate_bench
[ -x "$bin" ] || { echo "$bin was not built (nvcc missing at configure time?)"; exit 1; }
[ -f "$shim" ] || { echo "$shim was not built"; exit 1; }
read -r -a extra <<<"${BENCH_ARGS:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
data=$(mktemp); trap 'rm -f "$data"' EXIT
failures=0
for ((r = 1; r <= runs; r++)); do
  for mode in native shim; do
    if [ $mode = native ]; then
      got=$(timeout -k 10 "${RUN_TIMEOUT:-300}" "$bin" "${extra[@]}" 2>&1)
    else
      got=$(timeout -k 10 "${RUN_TIMEOUT:-300}" env LD_PRELOAD="$shim" "$bin" "${extra[@]}" 2>&1)
    fi
    rc=$?
    [ $r = 1 ] && [ $mode = native ] && grep '^#' <<<"$got"
    if [ $rc != 0 ]; then
      echo "run $r $mode: FAILED (exit $rc):"; tail -15 <<<"$got" | sed 's/^/  /'
      failures=$((failures + 1))
      continue
    fi
    line=$(grep -E '^[a-z0-9_]+ [0-9.]+$' <<<"$got")
    echo "run $r $mode: $(tr '\n' ' ' <<<"$line")"
    awk -v m=$mode '{print m, $1, $2}' <<<"$line" >> "$data"
  done
done
echo
python3 - "$data" <<'PY'
import statistics, sys
values = {}
order = []
for line in open(sys.argv[1]):
    mode, name, v = line.split()
    if name not in order:
        order.append(name)
    values.setdefault((mode, name), []).append(float(v))
print(f"{'measure (ns per call)':<32} {'native':>10} {'shim':>10} {'shim/native':>12}  runs")
for name in order:
    n = values.get(("native", name), [])
    s = values.get(("shim", name), [])
    nm = statistics.median(n) if n else float("nan")
    sm = statistics.median(s) if s else float("nan")
    ratio = f"{100 * sm / nm:.1f} %" if n and s and nm > 0 else "-"
    print(f"{name:<32} {nm:>10.1f} {sm:>10.1f} {ratio:>12}  {len(n)}/{len(s)}")
PY
echo "medians of the runs; each run's figure is the median of its batches"
if [ $failures != 0 ]; then echo "$failures runs failed"; exit 1; fi

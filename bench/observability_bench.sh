#!/usr/bin/env bash
# What seeing the memory costs per allocation: alloc_bench's cached-allocation loop
# (group "hit": cudaMalloc + cudaFree pairs with 1,000 allocations resident) natively and
# under the shim with each observability option, side by side from one invocation:
#   native            no shim
#   no-attribution    the shim, VMMSHIM_ATTRIBUTION=0
#   shim              the shim as it starts by default (caller attribution on)
#   history           + the memory history recording (VMMSHIM_SNAPSHOT_FILE)
#   history+stacks    + 16 call-stack frames per event (VMMSHIM_SNAPSHOT_STACKS=16)
# Each BENCH binary (a static-cudart and a shared-cudart build: attribution takes another
# path through the shared libcudart) runs every variant once uncounted, then ROUNDS rounds
# alternating the variants (even rounds in reverse order). observability_report.py prints
# the medians and the cost of each option per allocation.
# usage: bench/observability_bench.sh [--rounds N] [--quick] LIBVMMSHIM OUTDIR BENCH...
set -euo pipefail
rounds=3 quick=()
while [[ ${1:-} == --* ]]; do
  case $1 in
    --rounds) rounds=$2; shift ;;
    --quick) quick=(--quick) ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ $# -lt 3 ]; then
  echo "usage: bench/observability_bench.sh [--rounds N] [--quick] LIBVMMSHIM OUTDIR BENCH..." >&2
  exit 2
fi
shim=$1 out=$2
shift 2
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
variants=(native no-attribution shim history history+stacks)
run() {  # BENCH VARIANT OUTFILE
  local bench=$1 variant=$2 file=$3 env=()
  case $variant in
    native) env=() ;;
    no-attribution) env=(LD_PRELOAD="$shim" VMMSHIM_ATTRIBUTION=0) ;;
    shim) env=(LD_PRELOAD="$shim") ;;
    history) env=(LD_PRELOAD="$shim" VMMSHIM_SNAPSHOT_FILE="$out/snapshot.pickle") ;;
    history+stacks) env=(LD_PRELOAD="$shim" VMMSHIM_SNAPSHOT_FILE="$out/snapshot.pickle"
                         VMMSHIM_SNAPSHOT_STACKS=16) ;;
  esac
  env "${env[@]}" "$bench" "${quick[@]}" --only hit --label "$variant" > "$file"
}
for bench in "$@"; do
  name=$(basename "$bench")
  for v in "${variants[@]}"; do run "$bench" "$v" /dev/null; done
  for ((r = 1; r <= rounds; r++)); do
    order=("${variants[@]}")
    if ((r % 2 == 0)); then
      order=()
      for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[i]}"); done
    fi
    for v in "${order[@]}"; do run "$bench" "$v" "$out/$name.$v.$r.csv"; done
  done
done
python3 "$here/observability_report.py" "$out" | tee "$out/report.txt"

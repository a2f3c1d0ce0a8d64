#!/usr/bin/env bash
# Issue 13's measurements in one call on a GPU host (after tools/gpu-bundle.sh
# and tools/fetch-gpu-wheels.sh): the allocation benchmark natively, under
# vmmshim and (when built/baseline/libvmmshim-before-arenas.so exists) under
# the allocator before the per-thread front end, alternating, ROUNDS rounds;
# then the torch_memory_saver side-by-side (tools/compare-tms.sh).
# BENCH_ONLY=groups limits the benchmark (bench/alloc_bench.cc).
# usage: tools/gpu-issue13.sh [ROUNDS]
set -uo pipefail
source "$(dirname "$0")/gpu-host-env.sh"
rounds=${1:-2}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
base=()
[ -f "$b/baseline/libvmmshim-before-arenas.so" ] && base=(--baseline "$b/baseline/libvmmshim-before-arenas.so")
only=()
[ -n "${BENCH_ONLY:-}" ] && only=(--only "$BENCH_ONLY")
echo "== bench/run_bench.sh --rounds $rounds ${base[*]} ${only[*]}"
bash "$root/bench/run_bench.sh" --rounds "$rounds" "${base[@]}" "${only[@]}" \
  "$b/bench/alloc_bench" "$shim" "$out/bench" 2>&1 | tail -120
[ "${SKIP_TMS:-0}" = 1 ] || bash "$root/tools/compare-tms.sh" "${TMS_ROUNDS:-2}"

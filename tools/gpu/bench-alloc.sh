#!/usr/bin/env bash
# The allocation benchmark in one call on a GPU host (after tools/gpu/bundle.sh
# and tools/gpu/fetch-wheels.sh): the gpu-labelled checks, the allocation
# benchmark (bench/run_bench.sh) natively, under vmmshim and (when
# build/baseline/libvmmshim-HASH.so exists: tools/build/build-baseline.sh)
# under the allocator of that revision, alternating, ROUNDS rounds;
# then the torch_memory_saver side-by-side (tools/gpu/compare-tms.sh).
# BENCH_ONLY=groups limits the benchmark (bench/alloc_bench.cc); GPU_CTEST=0
# skips the gpu-labelled checks run first; SKIP_TMS=1 the comparison.
# usage: tools/gpu/bench-alloc.sh [ROUNDS]
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
rounds=${1:-2}
gpu_header_and_checks
base=()
baseline_lib=$(ls "$b"/baseline/libvmmshim-*.so 2>/dev/null | head -1)
[ -n "$baseline_lib" ] && base=(--baseline "$baseline_lib")
only=()
[ -n "${BENCH_ONLY:-}" ] && only=(--only "$BENCH_ONLY")
echo "== bench/run_bench.sh --rounds $rounds ${base[*]} ${only[*]}"
work=$(mktemp -d)
bash "$root/bench/run_bench.sh" --rounds "$rounds" "${base[@]}" "${only[@]}" \
  "$b/bench/alloc_bench" "$shim" "$work" 2>&1 | tee "$out/bench-table.txt" | tail -140
# The table's inputs and outputs, few files (each round's CSVs in one tar).
cp "$work"/results.csv "$work"/chart*.png "$out/" 2>/dev/null
tar -C "$work" -czf "$out/bench-rounds.tgz" .
[ "${SKIP_TMS:-0}" = 1 ] || bash "$root/tools/gpu/compare-tms.sh" "${TMS_ROUNDS:-2}"

#!/usr/bin/env bash
# End-to-end timings for docs/performance.md, native and under the shim, in
# one call on a GPU host (after tools/gpu/bundle.sh): a recorded allocation
# trace of alloc_mix replayed, PyTorch training steps, CuPy without its pool;
# then the gpu-labelled checks. Log: $OUT/perf-extra.log.
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/perf-extra.log") 2>&1
echo "== trace of alloc_mix (1 round) under the shim, replayed natively and under the shim"
LD_PRELOAD=$shim VMMSHIM_TRACE_FILE=/tmp/alloc_mix.trace.csv "$b/examples/alloc_mix" 1 | tail -1
wc -l /tmp/alloc_mix.trace.csv
bash "$root/bench/run_replay.sh" "$b/bench/replay" "$shim" /tmp/alloc_mix.trace.csv /tmp/replay
echo "== PyTorch training step"
for i in 1 2; do
  echo "native: $(python3 "$root/examples/torch_step_time.py")"
  echo "shim:   $(LD_PRELOAD=$shim python3 "$root/examples/torch_step_time.py")"
done
echo "== CuPy without its memory pool"
for i in 1 2; do
  echo "native: $(python3 "$root/examples/cupy_nopool.py")"
  echo "shim:   $(LD_PRELOAD=$shim python3 "$root/examples/cupy_nopool.py")"
done
[ "${SKIP_GPU_CHECKS:-0}" = 1 ] && exit 0  # when tools/gpu/validate.sh runs them anyway
echo "== gpu-labelled checks"
(cd "$b" && ctest -L gpu 2>&1 | grep -E "tests passed|Failed|Skipped")

#!/usr/bin/env bash
# Pause and resume of everything a process holds, on a GPU host after
# tools/gpu/bundle.sh: the gpu-labelled checks, then examples/sleep_wake.py on
# each allocator (PyTorch's caching allocator, its cudaMallocAsync backend and
# its expandable segments, CuPy's MemoryAsyncPool, JAX's cuda_async) with a KV_GIB GiB cache dropped and
# a WORK_GIB GiB phase in its place: native reference (no pause), then under
# the shim at log level info (the pause and resume lines say where the time
# went), alternated ROUNDS times after one uncounted warm-up run of each.
# Writes $OUT/sleep-wake.log.
# usage: tools/gpu/sleep-wake.sh [ROUNDS]   (KV_GIB, WORK_GIB: default 16; FRAMEWORKS:
# a subset)
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
rounds=${1:-2}
exec > >(tee "$out/sleep-wake.log") 2>&1
gpu_header_and_checks
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
app() { python3 "$root/examples/sleep_wake.py" --kv-gib "${KV_GIB:-16}" --work-gib "${WORK_GIB:-16}" "$@"; }
failures=0
for fw in ${FRAMEWORKS:-torch torch-async torch-expandable cupy-async jax-async}; do
  echo "== $fw"
  app --framework "$fw" --no-pause >/dev/null 2>&1            # warm-up, not reported
  LD_PRELOAD=$shim app --framework "$fw" >/dev/null 2>&1      # warm-up, not reported
  for ((i = 1; i <= rounds; i++)); do
    ref=$(app --framework "$fw" --no-pause 2>&1)
    got=$(LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info app --framework "$fw" 2>&1); rc=$?
    echo "native: $(grep ^result <<<"$ref")"
    grep -E '^sleep_wake:|vmmshim_(pause|resume)_memory\(|exit report' <<<"$got" | sed 's/^/shim: /'
    # Exit 0: the result after the resume equals the one before. JAX differs
    # between processes even natively, so only PyTorch and CuPy are also
    # compared with the native run.
    if [ $rc = 0 ] && { [ "$fw" = jax-async ] || [ "$(grep ^result <<<"$ref")" = "$(grep ^result <<<"$got")" ]; }; then
      echo "$fw round $i: result after the resume identical to the one before$([ "$fw" = jax-async ] || echo ' and to the native run')"
    else
      echo "$fw round $i: RESULT DIFFERS: $(grep ^result <<<"$got")"; failures=$((failures + 1))
      tail -20 <<<"$got"
    fi
  done
done
echo "runs whose result differed: $failures"

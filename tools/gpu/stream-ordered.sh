#!/usr/bin/env bash
# The stream-ordered validation in one GPU call, from the
# repository root on a GPU host after tools/gpu/bundle.sh (and
# tools/gpu/fetch-wheels.sh) ran on the build machine. Writes to $OUT.
#   - the gpu checks stream_ordered, torch_async, cupy_async, rmm_async;
#   - CuPy's MemoryAsyncPool loop and RMM's view resource timed natively and
#     under the shim, alternating, 4 and 2 times each (first runs included:
#     each run warms up itself);
#   - the allocation benchmark, 2 alternating rounds (its async rows).
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/stream-ordered.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
(cd "$b" && ctest -L gpu -R "gpu_(stream_ordered|torch_async|cupy_async|rmm_async)" -V 2>&1) |
  grep -vE '^(UpdateCTestConfiguration|Parse|Test project|Constructing|Checking|Updating|Add|Test command|Environment)' \
  > "$out/ctest-gpu-stream-ordered.txt"
grep -vE "^[0-9]+: (native|shim)   (PARITY)" "$out/ctest-gpu-stream-ordered.txt" | grep -E "^[0-9]+: |tests passed|Failed"
echo "== CuPy MemoryAsyncPool loop, alternating"
for i in 1 2 3 4; do
  echo "native $(python3 "$root/examples/cupy_async.py" 2>&1 | head -1)"
  echo "shim   $(LD_PRELOAD=$shim python3 "$root/examples/cupy_async.py" 2>&1 | head -1)"
done
if ls "$root"/.gpu/wheels/rmm*.whl >/dev/null 2>&1 && ! python3 -c "import rmm" 2>/dev/null; then
  site=$(mktemp -d)
  pip install --quiet --no-index --no-deps --target "$site" "$root"/.gpu/wheels/*.whl 2>/dev/null
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
echo "== RMM view resource on the default pool, alternating"
for i in 1 2; do
  echo "native $(python3 "$root/examples/rmm_async.py" --resource view 2>&1 | head -1)"
  echo "shim   $(LD_PRELOAD=$shim python3 "$root/examples/rmm_async.py" --resource view 2>&1 | head -1)"
done
echo "== the streamOrderedAllocation-style sample, alternating (us per iteration)"
for i in 1 2 3; do
  echo "native $("$b/examples/stream_ordered_sample" 2>&1 | grep -oE '^INFO [a-z-]+: .*each' | sed 's/ iterations in [0-9.]* s//' | tr '\n' ' ')"
  echo "shim   $(LD_PRELOAD=$shim "$b/examples/stream_ordered_sample" 2>/dev/null | grep -oE '^INFO [a-z-]+: .*each' | sed 's/ iterations in [0-9.]* s//' | tr '\n' ' ')"
done
echo "== the same, with the shim's exit report"
LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info "$root/.gpu/build/examples/stream_ordered_sample" 2>&1 | grep 'exit report'
LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info python3 "$root/examples/cupy_async.py" 2>&1 | grep 'exit report'
echo "== benchmark: bench/run_bench.sh --rounds 2"
bash "$root/bench/run_bench.sh" --rounds 2 "$b/bench/alloc_bench" "$shim" /tmp/bench > "$out/bench.txt" 2>&1
cp /tmp/bench/results.csv "$out/bench-results.csv"
grep -E "^\| (metric|async|warm_pair|churn)" "$out/bench.txt" | tail -24

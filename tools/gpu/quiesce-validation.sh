#!/usr/bin/env bash
# The busy-process validation in one GPU call (after tools/gpu/bundle.sh): the
# launch path's cost native and under the shim (tools/gpu/launch-gate-bench.sh),
# sleeps and pauses of a busy PyTorch process in the three allocator modes
# (tools/gpu/busy-sleep.sh), what real programs resolve and which of it the gate
# holds (tools/gpu/resolved-entry-points.sh), then the gpu-labelled checks
# CHECKS (a ctest -R pattern; default: the allocation paths and the sleeps) in
# the time left of BUDGET seconds (default 570). RUNS: the launch bench's runs
# each way (default 10); MODES: busy-sleep.sh's allocator modes (default all
# three). Logs under $OUT; a run's own files packed into busy-sleep-runs.tar.gz.
# usage: tools/gpu/quiesce-validation.sh
set -uo pipefail
here=$(dirname "$0")
source "$here/host-env.sh"
start=$SECONDS
budget=${BUDGET:-570}
left() { echo $((budget - (SECONDS - start))); }
RUNS=${RUNS:-10} timeout -k 5 $(( ${RUNS:-10} * 12 + 20 )) "$here/launch-gate-bench.sh" > /dev/null 2>&1
echo "launch gate bench: exit $?"; tail -6 "$out/launch-gate-bench.log"
STEPS=${STEPS:-3000} CYCLES=10 PAUSES=20 SLEEP_GAP_MS=150,600 PAUSE_GAP_MS=80,300 \
  PAUSE_HOLD_MS=30,150 REFERENCE=native RUN_TIMEOUT=200 \
  timeout -k 5 $(( $(left) - 90 )) "$here/busy-sleep.sh" > /dev/null 2>&1
echo "busy sleep: exit $?"; sed -n '/== summary/,$p' "$out/busy-sleep.log"
tar -C "$out" -czf "$out/busy-sleep-runs.tar.gz" busy-sleep 2>/dev/null && rm -rf "$out/busy-sleep"
timeout -k 5 $(( $(left) - 10 > 120 ? 120 : $(left) - 10 )) "$here/resolved-entry-points.sh" > /dev/null 2>&1
echo "resolved entry points: exit $?"; grep -E "^== " "$out/resolved-entry-points.log"
rm -f "$out"/*.stdout
checks=${CHECKS:-'gpu_(static_cudart|cudart_like|driver_api|torch|torch_async|deep_sleep|sleep_wake|safe_pause|cupy_async)$'}
if [ "$(left)" -gt 60 ]; then
  (cd "$b" && timeout -k 5 $(( $(left) - 10 )) ctest -L gpu -R "$checks" --output-on-failure) \
    > "$out/ctest-gpu.txt" 2>&1
  echo "ctest -L gpu -R '$checks': exit $?"
  grep -E "Test +#|tests passed|Failed|\*\*\*" "$out/ctest-gpu.txt" | tail -20
fi

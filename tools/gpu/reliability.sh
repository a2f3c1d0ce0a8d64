#!/usr/bin/env bash
# The GPU part of the reliability work (docs/reliability.md), in one call on a
# GPU host after tools/gpu/bundle.sh: compute-sanitizer memcheck (with
# --leak-check full) over the examples, natively, under the shim, and under
# the shim without its cache (VMMSHIM_CACHE_LIMIT=0, for comparison;
# docs/reliability.md), and a
# soak run (allocation churn with kernels, memory back to its start at the
# end) under the shim. Logs to $OUT (or ./gpu-out).
# usage: bash tools/gpu/reliability.sh [SOAK_SECONDS]   (default 150)
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
soak_seconds=${1:-150}
exec > >(tee "$out/reliability.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$cs" --version | head -2
status=0
sanitize() {  # name, then the command
  local name=$1; shift
  for mode in native shim shim-nocache; do
    local pre="" cache=10%
    [ $mode != native ] && pre=$shim
    [ $mode = shim-nocache ] && cache=0
    LD_PRELOAD=$pre VMMSHIM_CACHE_LIMIT=$cache "$cs" --tool memcheck --leak-check full --error-exitcode 99 "$@" \
      > "$out/memcheck-$name-$mode.txt" 2>&1
    local rc=$?
    echo "memcheck $name ($mode): exit $rc; $(grep -E '^========= (ERROR SUMMARY|LEAK SUMMARY)' "$out/memcheck-$name-$mode.txt" | tr '\n' ' ')"
    [ $rc = 0 ] || status=1
  done
}
echo "== soak under the shim, ${soak_seconds} s"
LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info "$b/examples/soak" "$soak_seconds" || status=1
sanitize alloc_mix "$b/examples/alloc_mix" 1
sanitize lifecycle_probe "$b/examples/lifecycle_probe"
sanitize ipc_share "$b/examples/ipc_share"
sanitize driver_api_demo "$b/examples/driver_api_demo"
sanitize soak_20s "$b/examples/soak" 20
exit $status

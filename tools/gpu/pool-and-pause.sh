#!/usr/bin/env bash
# The stream-ordered pool's figures and other libraries' VMM memory paused,
# on a GPU host after tools/gpu/bundle.sh: the gpu-labelled checks
# (GPU_CTEST=0 skips them), examples/cupy_pool_figures.py natively and under
# the shim (its PARITY lines must match), then examples/sleep_wake.py with
# PyTorch's expandable segments (tools/gpu/sleep-wake.sh). Writes
# $OUT/pool-and-pause.log.
# usage: tools/gpu/pool-and-pause.sh
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/pool-and-pause.log") 2>&1
gpu_header_and_checks
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
echo "== cupy_pool_figures: native, then under the shim"
native=$(python3 "$root/examples/cupy_pool_figures.py" 2>&1)
shim_out=$(LD_PRELOAD=$shim python3 "$root/examples/cupy_pool_figures.py" 2>&1)
sed 's/^/native: /' <<<"$native"
sed 's/^/shim: /' <<<"$shim_out"
if [ "$(grep ^PARITY <<<"$native")" = "$(grep ^PARITY <<<"$shim_out")" ]; then
  echo "cupy_pool_figures: PARITY lines identical"
else
  echo "cupy_pool_figures: PARITY lines DIFFER"
fi
GPU_CTEST=0 FRAMEWORKS=torch-expandable bash "$root/tools/gpu/sleep-wake.sh" "${ROUNDS:-2}"

#!/usr/bin/env bash
# Builds vmmshim and runs the main job. On a machine with an NVIDIA GPU: a
# plain nvcc program (static cudart, thousands of allocations from 256 B to
# 1 GiB, every result checked), natively and under LD_PRELOAD=libvmmshim.so.
# Without a GPU: a driver-API program under the shim on the SIMULATED driver.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
shim=$PWD/build/libvmmshim.so
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  if [ -x build/examples/alloc_mix ]; then
    echo "== native run"
    build/examples/alloc_mix 1
    echo "== the same program under LD_PRELOAD=$shim"
    LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info build/examples/alloc_mix 1
  else
    echo "== nvcc was not found at build time; running the driver-API demo on the GPU"
    LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info build/examples/driver_api_demo
  fi
else
  echo "== No NVIDIA GPU on this machine. Running examples/driver_api_demo under"
  echo "== LD_PRELOAD=$shim on the SIMULATED driver (build/simcuda/libcuda.so.1,"
  echo "== host memory, tests/sim), not on a GPU."
  LD_LIBRARY_PATH=$PWD/build/simcuda LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info \
    build/examples/driver_api_demo
fi

#!/usr/bin/env bash
# Builds vmmshim and runs the main job. On a machine with an NVIDIA GPU: a
# plain nvcc program (static cudart, thousands of allocations from 256 B to
# 1 GiB, every result checked), natively and under LD_PRELOAD=libvmmshim.so.
# Without a GPU: a driver-API program under the shim on the SIMULATED driver,
# then `vmmshim compare` of a ring exchange on 4 simulated GPUs (bytes mapped
# into peers per policy), then a busy process slept and woken from outside
# with `vmmshim sleep` and `vmmshim wake`. With two GPUs or more, the comparison of
# examples/peer_access on the real GPUs follows the nvcc program.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs (the tests and benchmarks are tools/test.sh's): the
# shim, the CLI, the simulated driver and the examples below.
targets=(vmmshim vmmshim_cli cuda_sim driver_api_demo peer_exchange busy_driver_loop)
gpu=0
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && gpu=1
[ $gpu = 1 ] && targets+=(alloc_mix peer_access)  # nvcc programs, run only on a GPU
echo "== building ${targets[*]} into build/ (a fresh clone: Abseil once, then the shim)"
tools/build/build.sh "${targets[@]}"
shim=$PWD/build/libvmmshim.so
# compare's exit status is 1 when a policy broke the program (none does here,
# on purpose); only 2 (the comparison could not be made) stops the demo.
compare() {
  local rc=0
  build/vmmshim compare "$@" || rc=$?
  [ $rc -le 1 ] || exit $rc
}
if [ $gpu = 1 ]; then
  if [ -x build/examples/alloc_mix ]; then
    echo "== native run"
    build/examples/alloc_mix 1
    echo "== the same program under LD_PRELOAD=$shim"
    LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info build/examples/alloc_mix 1
    if [ "$(nvidia-smi -L | grep -c '^GPU ')" -ge 2 ] && [ -x build/examples/peer_access ]; then
      echo "== vmmshim compare: device 0 reads device 1's buffers (examples/peer_access)"
      compare --policies all,min-size:1M,none --check '^(PASSED|FAILED)' \
        --out build/compare-demo -- build/examples/peer_access
    fi
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
  echo
  echo "== vmmshim compare on 4 SIMULATED GPUs: examples/peer_exchange (each device reads"
  echo "== its neighbour's 8 MiB exchange buffer; 200 x 256 KiB per device stay local)"
  echo "== natively and under policies all, min-size:1M and none. none is expected to"
  echo "== fail: the program needs the exchange buffers mapped. Times are the simulation's."
  LD_LIBRARY_PATH=$PWD/build/simcuda SIMCUDA_DEVICES=4 \
    compare --policies all,min-size:1M,none --out build/compare-demo -- \
    build/examples/peer_exchange
  echo
  echo "== vmmshim sleep and wake on the SIMULATED driver: examples/busy_driver_loop holds"
  echo "== 64 MiB and checks it every 20 ms; it is put to sleep from outside mid-loop, listed,"
  echo "== woken, and checks its memory to the end (the simulated checkpoint keeps host memory)"
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  LD_LIBRARY_PATH=$PWD/build/simcuda LD_PRELOAD=$shim build/examples/busy_driver_loop 6 \
    > "$out/loop.out" &
  loop=$!
  for _ in $(seq 100); do grep -q '^ready' "$out/loop.out" && break; sleep 0.1; done
  sleep 1
  LD_LIBRARY_PATH=$PWD/build/simcuda build/vmmshim sleep $loop
  build/vmmshim ps
  sleep 1
  LD_LIBRARY_PATH=$PWD/build/simcuda build/vmmshim wake $loop
  wait $loop
  cat "$out/loop.out"
fi

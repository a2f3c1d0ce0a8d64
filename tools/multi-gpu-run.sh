#!/usr/bin/env bash
# The multi-GPU validation and measurements in one call (docs/multi-gpu.md),
# for any number of GPUs, run from the repository root on the GPU machine
# after tools/gpu-bundle.sh on the build machine. Logs to
# $OUT/multi-gpu-<N>gpu.log; tools/plot_multi_gpu.py draws the charts and
# prints the tables from it. Sections that need two GPUs say so on one.
# Timed sections run every mode twice, alternated (the order reversed in the
# second round), after one uncounted warm-up run of native and of the shim.
# SECTIONS (default "1 2 3 4 5 6 7 8"): the sections to run, for splitting the
# run over two calls where one call's time limit is too short (8 GPUs).
# COLD_ITERS (default 20): timed allocations per size and peer count in 6 and 8.
# Never creates a multicast object (NVLS off for NCCL, PyTorch, NVSHMEM).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source "$(dirname "$0")/gpu-host-env.sh"
bin=$b/bench/multi_gpu
gpus=$(nvidia-smi -L | grep -c '^GPU ')
exec > >(tee "$out/multi-gpu-${gpus}gpu.log") 2>&1
echo "== machine: $gpus GPU(s)"
nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
nvidia-smi topo -m
python3 -c "import torch; print('torch', torch.__version__)" 2>/dev/null

declare -A policy_env=(
  [native]=""
  [all]="LD_PRELOAD=$shim"
  [none]="LD_PRELOAD=$shim VMMSHIM_PEER_POLICY=none"
  [min-size]="LD_PRELOAD=$shim VMMSHIM_PEER_POLICY=min-size VMMSHIM_PEER_MIN_BYTES=1M"
  [rules]="LD_PRELOAD=$shim VMMSHIM_CONFIG=$root/examples/peer_access/rules.toml"
  # The shim never asks the driver to enable (core/peer_enable.h): the
  # driver's peer-connection limit does not apply to it.
  [all-emulated]="LD_PRELOAD=$shim VMMSHIM_PEER_ENABLE_DRIVER=0"
)
order=(native all none min-size rules)
timed=(native all none min-size)
run() {  # run POLICY TIMEOUT ARGS...   (shim log at info: the denials)
  local policy=$1 t=$2; shift 2
  env ${policy_env[$policy]} VMMSHIM_LOG_LEVEL=info timeout "$t" "$@" 2>&1
  local rc=$?
  [ $rc = 124 ] && echo "HANG: timed out after $t s"
  return $rc
}
alternate() {  # alternate TIMEOUT GREP ARGS...: each of $modes (default: timed) twice
  local t=$1 pattern=$2; shift 2
  local forward=(${modes:-${timed[@]}})
  env ${policy_env[all]} timeout "$t" "$bin" "$@" > /dev/null 2>&1   # warm-ups, not counted
  timeout "$t" "$bin" "$@" > /dev/null 2>&1
  for round in 1 2; do
    local order_now=("${forward[@]}")
    [ $round = 2 ] && order_now=($(printf '%s\n' "${forward[@]}" | tac))
    for p in "${order_now[@]}"; do
      echo "-- $p (round $round)"
      env ${policy_env[$p]} timeout "$t" "$bin" "$@" 2>&1 | grep -E "$pattern|HANG|rror"
    done
  done
}

sections=" ${SECTIONS:-1 2 3 4 5 6 7 8} "
want() { [[ $sections == *" $1 "* ]]; }
echo "sections: $sections"

if [ "$gpus" -ge 2 ] && want 1; then
  echo "== 1. correctness: every device reads and writes every other device's buffers"
  for p in "${order[@]}"; do
    echo "-- $p"; run "$p" 300 "$bin" correct | grep -E "correct:|policy:"
  done
  echo "== 1b. a denied buffer faults in a child process (timeout 20 s: a hang is reported)"
  for c in "none 4096" "min-size 4096" "none 67108864" "all 4096"; do
    set -- $c
    echo "-- $1, $2 bytes:"; run "$1" 20 "$bin" fault "$2" | grep -E "fault:|HANG|denied access"
  done
  echo "== 1c. cudaMemcpyPeer"
  for p in native all none; do echo "-- $p"; run "$p" 120 "$bin" copy | grep copy:; done
fi
if [ "$gpus" -ge 2 ] && want 2; then
  echo "== 2a. cudaDeviceEnablePeerAccess time vs live allocations on the peer"
  for n in 10 1000 10000; do alternate 300 "enable:" enable $n; done
  echo "== 2b. cudaMalloc/cudaFree latency on device 1 with 0 and 1 peers enabled (cache hits)"
  alternate 300 "latency:" latency
  echo "== 2c. bytes mapped into peers (stats file), policy by policy"
  for p in all none min-size rules; do
    env ${policy_env[$p]} VMMSHIM_STATS_FILE=/tmp/stats-$p.json "$bin" correct > /dev/null 2>&1
    python3 - "$p" /tmp/stats-$p.json <<'PY'
import json, sys
doc = json.load(open(sys.argv[2]))
for d in doc["devices"]:
    for p in d["peers"]:
        print(f"{sys.argv[1]}: device {d['device']} -> peer {p['peer']}: grants {p['grants']}, "
              f"denials {p['denials']}, peak mapped {p['peak_mapped_bytes']} bytes; "
              f"set_access_calls {d['set_access_calls']}")
PY
  done
fi
[ "$gpus" -lt 2 ] && echo "== 1, 2, 4, 5, 7: need two GPUs (this machine has $gpus)"
if want 3; then
  echo "== 3. parity of return codes"
  "$b/examples/parity_probe" > /tmp/pn.txt 2>&1
  LD_PRELOAD=$shim "$b/examples/parity_probe" > /tmp/ps.txt 2>&1
  diff <(grep ^PARITY /tmp/pn.txt) <(grep ^PARITY /tmp/ps.txt) && echo "PARITY lines identical ($(grep -c ^PARITY /tmp/pn.txt))"
  grep -i peer /tmp/pn.txt
fi
if [ "$gpus" -ge 2 ] && want 4; then
  echo "== 4. examples/peer_access under each policy"
  for p in "${order[@]}"; do echo "-- $p"; run "$p" 120 "$b/examples/peer_access" | grep -vE "^\[vmmshim"; done
fi
if [ "$gpus" -ge 2 ] && want 5; then
  echo "== 5. PyTorch: a model split across all $gpus GPUs; NCCL all-reduce, one process per GPU"
  for p in native all; do
    echo "-- $p: $(run "$p" 300 python3 "$root/examples/torch_split_model.py" | grep torch_split_model)"
    run "$p" 300 python3 "$root/examples/torch_allreduce.py" | grep -E "torch_allreduce|Error|error" | head -9
  done
fi
if want 6; then
  echo "== 6. cold cudaMalloc on device 0 with 0..$((gpus - 1)) peers enabled"
  alternate 600 "cold:" cold "${COLD_ITERS:-20}"
fi
if [ "$gpus" -ge 2 ] && want 7; then
  echo "== 7. cudaDeviceEnablePeerAccess for all $((gpus * (gpus - 1))) ordered pairs"
  modes="${timed[*]} all-emulated" alternate 300 "enable-all:" enable-all 1000
fi
if want 8; then
  echo "== 8. cudaMallocAsync from device 0's default pool accessible to 0..$((gpus - 1)) peers"
  alternate 600 "pool:" pool "${COLD_ITERS:-20}"
fi
echo "== done"

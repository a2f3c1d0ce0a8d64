#!/usr/bin/env bash
# The multi-GPU validation and measurements in one call (docs/multi-gpu.md),
# run from the repository root on a machine with two or more GPUs after
# tools/gpu-bundle.sh on the build machine. Logs to $OUT/multi-gpu.log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source "$(dirname "$0")/gpu-host-env.sh"
bin=$b/bench/multi_gpu
exec > >(tee "$out/multi-gpu.log") 2>&1
nvidia-smi -L; nvidia-smi topo -m

declare -A policy_env=(
  [native]=""
  [all]="LD_PRELOAD=$shim"
  [none]="LD_PRELOAD=$shim VMMSHIM_PEER_POLICY=none"
  [min-size]="LD_PRELOAD=$shim VMMSHIM_PEER_POLICY=min-size VMMSHIM_PEER_MIN_BYTES=1M"
  [rules]="LD_PRELOAD=$shim VMMSHIM_CONFIG=$root/examples/peer_access/rules.toml"
)
order=(native all none min-size rules)
run() {  # run POLICY TIMEOUT ARGS...
  local policy=$1 t=$2; shift 2
  env ${policy_env[$policy]} VMMSHIM_LOG_LEVEL=info timeout "$t" "$@" 2>&1
  local rc=$?
  [ $rc = 124 ] && echo "HANG: timed out after $t s"
  return $rc
}

echo "== 1. correctness: device 0 reads and writes device 1's buffers"
for p in "${order[@]}"; do
  echo "-- $p"; run "$p" 120 "$bin" correct | grep -E "correct:|denied access|policy:"
done
echo "== 1b. a denied buffer faults in a child process (timeout 20 s: a hang is reported)"
for c in "none 4096" "min-size 4096" "none 67108864" "all 4096"; do
  set -- $c
  echo "-- $1, $2 bytes:"; run "$1" 20 "$bin" fault "$2" | grep -E "fault:|HANG|denied access"
done
echo "== 1c. cudaMemcpyPeer"
for p in native all none; do echo "-- $p"; run "$p" 120 "$bin" copy | grep copy:; done
echo "== 2a. cudaDeviceEnablePeerAccess time vs live allocations on the peer"
for p in native all min-size none; do
  for n in 10 1000 10000; do echo "-- $p: $(run "$p" 300 "$bin" enable $n | grep enable:)"; done
done
echo "== 2b. cudaMalloc/cudaFree latency on device 1 with 0 and 1 peers enabled"
for p in native all none; do echo "-- $p"; run "$p" 300 "$bin" latency | grep latency:; done
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
echo "== 3. parity of return codes on two GPUs"
"$b/examples/parity_probe" > /tmp/pn.txt 2>&1
LD_PRELOAD=$shim "$b/examples/parity_probe" > /tmp/ps.txt 2>&1
diff <(grep ^PARITY /tmp/pn.txt) <(grep ^PARITY /tmp/ps.txt) && echo "PARITY lines identical ($(grep -c ^PARITY /tmp/pn.txt))"
grep -i peer /tmp/pn.txt
echo "== 4. examples/peer_access under each policy"
for p in "${order[@]}"; do echo "-- $p"; run "$p" 120 "$b/examples/peer_access" | grep -vE "^\[vmmshim"; done
echo "== 5. PyTorch: a model split across two GPUs; NCCL all-reduce in two processes"
for p in native all; do
  echo "-- $p: $(run "$p" 300 python3 "$root/examples/torch_two_gpu.py" | grep torch_two_gpu)"
  run "$p" 300 python3 "$root/examples/torch_allreduce.py" | grep -E "torch_allreduce|Error|error" | head -5
done

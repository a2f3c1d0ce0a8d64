#!/usr/bin/env bash
# The multi-GPU validation and measurements (docs/multi-gpu.md), for any
# number of GPUs, run from the repository root on the GPU machine after
# tools/gpu/bundle.sh on the build machine. Logs to
# $OUT/multi-gpu-<N>gpu[-<sections>].log; tools/docs/plot_multi_gpu.py draws the
# charts and prints the tables from it (or from several logs of one machine).
#
# Sections, in this order (the issue's new measurements first):
#   6 cold cudaMalloc with 0..N-1 peers   7 enable every ordered pair
#   5 PyTorch split model, NCCL all-reduce 8 default pool with 0..N-1 peers
#   1 correctness, faults, copies          2 enable cost, cache hits, bytes
#   3 return-code parity                   4 examples/peer_access
# Timed sections (2, 6, 7, 8) run every mode twice, alternated (the order
# reversed in the second round), after one uncounted warm-up run of native
# and of the shim. Every program runs under a time limit; a failure shows as
# "EXIT rc" with its CUDA error line, a time-out as "HANG".
#
# SECTIONS (default "6 7 5 8 1 2 3 4"): the sections to run.
# BUDGET_S (default 540): a section starts only while the run is younger
# than this; the ones left are named at the end, with the command that runs
# them in a second call (one call of the GPU machine is limited to 600 s).
# COLD_ITERS (default 20): timed allocations per size and peer count (6, 8).
# Never creates a multicast object (NVLS off for NCCL, PyTorch, NVSHMEM).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source "$(dirname "$0")/host-env.sh"
bin=$b/bench/multi_gpu
gpus=$(nvidia-smi -L | grep -c '^GPU ')
sections=" $(tr ', ' '  ' <<<"${SECTIONS:-6 7 5 8 1 2 3 4}") "
budget=${BUDGET_S:-540}
tag=${SECTIONS:+-s$(tr -dc '0-9' <<<"$SECTIONS")}
exec > >(tee "$out/multi-gpu-${gpus}gpu${tag}.log") 2>&1
echo "== machine: $gpus GPU(s), $(date -u '+%F %T') UTC, sections:$sections budget ${budget} s"
nvidia-smi -L
nvidia-smi --query-gpu=index,driver_version,persistence_mode --format=csv,noheader
nvidia-smi topo -m
python3 -c "import torch; print('torch', torch.__version__)" 2>/dev/null

declare -A policy_env=(
  [native]=""
  [all]="LD_PRELOAD=$shim"
  [none]="LD_PRELOAD=$shim VMMSHIM_PEER_POLICY=none"
  [min-size]="LD_PRELOAD=$shim VMMSHIM_PEER_POLICY=min-size VMMSHIM_PEER_MIN_BYTES=1M"
  [rules]="LD_PRELOAD=$shim VMMSHIM_CONFIG=$root/examples/peer_access/rules.toml"
  # The shim never asks the driver to enable (core/peer/enable/peer_enable.h): the
  # driver's peer-connection limit does not apply to it.
  [all-emulated]="LD_PRELOAD=$shim VMMSHIM_PEER_ENABLE_DRIVER=0"
)
order=(native all none min-size rules)
timed=(native all none min-size)

# show MODE TIMEOUT PATTERN CMD...: runs CMD in MODE's environment under a
# time limit and prints its lines matching PATTERN, any failed CUDA call
# (CHECK_CUDA's "call -> error") or Python error, then HANG or EXIT when it
# did not end well. SHOW_ENV adds variables (the shim's log level).
show() {
  local mode=$1 t=$2 pattern=$3; shift 3
  local output rc
  output=$(env ${policy_env[$mode]} ${SHOW_ENV:-} timeout -k 10 "$t" "$@" 2>&1)
  rc=$?
  grep -E "$pattern| -> |Error|error:|Traceback" <<<"$output"
  if [ $rc = 124 ] || [ $rc = 137 ]; then echo "HANG: $mode: $* timed out after $t s"
  elif [ $rc != 0 ]; then echo "EXIT $rc: $mode: $*"; fi
  return 0
}
# alternate TIMEOUT PATTERN ARGS...: bench/multi_gpu ARGS under each of
# $modes (default: the timed ones) twice, default log level.
alternate() {
  local t=$1 pattern=$2; shift 2
  local forward=(${modes:-${timed[@]}})
  timeout -k 10 "$t" env ${policy_env[all]} "$bin" "$@" > /dev/null 2>&1  # warm-ups, not counted
  timeout -k 10 "$t" "$bin" "$@" > /dev/null 2>&1
  for round in 1 2; do
    local order_now=("${forward[@]}")
    [ $round = 2 ] && order_now=($(printf '%s\n' "${forward[@]}" | tac))
    for p in "${order_now[@]}"; do
      echo "-- $p (round $round)"
      show "$p" "$t" "$pattern" "$bin" "$@"
    done
  done
}
left=()
# section N NEEDS_GPUS: whether to run section N now (asked, enough GPUs,
# time left); prints its start time.
section() {
  [[ $sections == *" $1 "* ]] || return 1
  if [ "$gpus" -lt "$2" ]; then echo "== section $1 needs $2 GPUs (this machine has $gpus)"; return 1; fi
  if [ $SECONDS -ge "$budget" ]; then left+=("$1"); return 1; fi
  echo "== [t=${SECONDS}s] section $1"
  return 0
}

for s in $sections; do
  case $s in
  6) section 6 1 || continue
     echo "== 6. cold cudaMalloc on device 0 with 0..$((gpus - 1)) peers enabled"
     alternate 150 "cold:" cold "${COLD_ITERS:-20}" ;;
  7) section 7 2 || continue
     echo "== 7. cudaDeviceEnablePeerAccess for all $((gpus * (gpus - 1))) ordered pairs"
     modes="${timed[*]} all-emulated" alternate 120 "enable-all:" enable-all 1000 ;;
  5) section 5 2 || continue
     echo "== 5. PyTorch: a model split across all $gpus GPUs; NCCL all-reduce, one process per GPU"
     for p in native all; do
       echo "-- $p"
       show "$p" 120 "torch_split_model" python3 "$root/examples/torch_split_model.py" | tee /tmp/split-$p.txt
       show "$p" 120 "torch_allreduce" python3 "$root/examples/torch_allreduce.py"
     done
     if cmp -s <(grep "^torch_split_model:" /tmp/split-native.txt) \
               <(grep "^torch_split_model:" /tmp/split-all.txt) &&
        grep -q "^torch_split_model:" /tmp/split-native.txt; then
       echo "torch_split_model: native and shim output identical"
     else
       echo "torch_split_model: native and shim output DIFFER"
     fi ;;
  8) section 8 1 || continue
     echo "== 8. cudaMallocAsync from device 0's default pool accessible to 0..$((gpus - 1)) peers"
     alternate 150 "pool:" pool "${COLD_ITERS:-20}" ;;
  1) section 1 2 || continue
     echo "== 1. correctness: every device reads and writes every other device's buffers"
     for p in "${order[@]}"; do
       echo "-- $p"; SHOW_ENV=VMMSHIM_LOG_LEVEL=info show "$p" 120 "correct:|policy:" "$bin" correct
     done
     echo "== 1b. a denied buffer faults in a child process (a hang is reported)"
     for c in "none 4096" "min-size 4096" "none 67108864" "all 4096"; do
       set -- $c
       echo "-- $1, $2 bytes:"; show "$1" 20 "fault:|denied access" "$bin" fault "$2"
     done
     echo "== 1c. cudaMemcpyPeer"
     for p in native all none; do echo "-- $p"; show "$p" 60 "copy:" "$bin" copy; done ;;
  2) section 2 2 || continue
     echo "== 2a. cudaDeviceEnablePeerAccess time vs live allocations on the peer"
     for n in 10 1000 10000; do alternate 120 "enable:" enable $n; done
     echo "== 2b. cudaMalloc/cudaFree latency on device 1 with 0 and 1 peers enabled (cache hits)"
     alternate 120 "latency:" latency
     echo "== 2c. bytes mapped into peers (stats file), policy by policy"
     for p in all none min-size rules; do
       SHOW_ENV=VMMSHIM_STATS_FILE=/tmp/stats-$p.json show "$p" 120 "correct: (PASSED|FAILED)" "$bin" correct
       python3 - "$p" /tmp/stats-$p.json <<'PY'
import json, sys
doc = json.load(open(sys.argv[2]))
for d in doc["devices"]:
    print(f"{sys.argv[1]}: device {d['device']}: set_access_calls {d['set_access_calls']}")
    for p in d["peers"]:
        print(f"{sys.argv[1]}: device {d['device']} -> peer {p['peer']}: grants {p['grants']}, "
              f"denials {p['denials']}, peak mapped {p['peak_mapped_bytes']} bytes")
PY
     done ;;
  3) section 3 1 || continue
     echo "== 3. parity of return codes"
     timeout -k 10 120 "$b/examples/parity_probe" > /tmp/pn.txt 2>&1
     timeout -k 10 120 env LD_PRELOAD=$shim "$b/examples/parity_probe" > /tmp/ps.txt 2>&1
     if diff <(grep ^PARITY /tmp/pn.txt) <(grep ^PARITY /tmp/ps.txt); then
       echo "PARITY lines identical ($(grep -c ^PARITY /tmp/pn.txt))"
     fi
     grep -i peer /tmp/pn.txt ;;
  4) section 4 2 || continue
     echo "== 4. examples/peer_access under each policy"
     for p in "${order[@]}"; do echo "-- $p"; show "$p" 120 "." "$b/examples/peer_access" | grep -v "^\[vmmshim"; done ;;
  *) echo "== unknown section $s" ;;
  esac
done
echo "== [t=${SECONDS}s] done"
if [ ${#left[@]} -gt 0 ]; then
  echo "== not run for lack of time: sections ${left[*]}; run them in another call:"
  echo "   SECTIONS=\"${left[*]}\" bash tools/gpu/multi-gpu-run.sh"
fi

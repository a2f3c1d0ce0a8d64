#!/usr/bin/env bash
# Pause and resume (docs/pause-resume.md) against torch_memory_saver on a GPU
# host (after tools/gpu/bundle.sh and tools/gpu/fetch-wheels.sh):
# examples/pause_resume.py (a PyTorch model and a KV_GIB GiB `kv` buffer) natively
# without a pause (the reference result), under vmmshim pausing `kv` with its
# contents and without, and under torch_memory_saver (preload mode, CPU backup),
# after one warm-up run of each that is not reported, alternating ROUNDS times; every paused run's result line must equal the
# reference. Logs to $OUT/pause-resume.log.
# usage: tools/gpu/pause-resume-vs-tms.sh [ROUNDS]   (KV_GIB, default 8; CYCLES: pauses and
# resumes per process, default 1)
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
rounds=${1:-2}
kv=${KV_GIB:-8}
exec > >(tee "$out/pause-resume.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
unpack_tms
app="python3 $root/examples/pause_resume.py --kv-gib $kv --cycles ${CYCLES:-1}"
# One warm-up run of each mode, not reported (page cache, CUDA and PyTorch
# start-up, the first touch of THP host memory).
LD_PRELOAD=$shim $app --backend vmmshim --pause >/dev/null 2>&1
[ -n "$tms_dir" ] && LD_PRELOAD=$tms PYTHONPATH=$tms_dir $app --backend tms --pause >/dev/null 2>&1
ref=$($app --backend none 2>/dev/null | grep "result")
echo "reference (native, no pause): $ref"
failures=0
check() {  # check LABEL OUTPUT
  local got; got=$(grep "result" <<<"$2")
  grep -E "pause_resume: .*contents( \(cycle [0-9]+\))?:" <<<"$2" | sed "s/^/$1: /"
  grep -E "pause_resume: (start|paused|resumed):" <<<"$2" | sed "s/^/$1: /"
  grep -E "exit report" <<<"$2" | sed "s/^/$1: /"
  if [ "$got" = "$ref" ]; then echo "$1: result identical to the reference"; else
    echo "$1: RESULT DIFFERS: $got"; failures=$((failures + 1)); fi
}
for ((i = 1; i <= rounds; i++)); do
  echo "== round $i"
  out1=$(LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info $app --backend vmmshim --pause 2>&1)
  check "vmmshim" "$out1"
  if [ -n "$tms_dir" ]; then
    out2=$(LD_PRELOAD=$tms PYTHONPATH=$tms_dir $app --backend tms --pause 2>&1)
    check "torch_memory_saver" "$out2"
  fi
  out3=$(LD_PRELOAD=$shim $app --backend vmmshim --pause --no-keep 2>&1)
  grep -E "pause_resume: .*contents( \(cycle [0-9]+\))?:" <<<"$out3" | sed "s/^/vmmshim (no contents): /"
done
echo "runs whose result differed from the reference: $failures"

#!/usr/bin/env bash
# Everything a PyTorch process holds put to sleep and woken up, on a GPU host
# after tools/gpu/bundle.sh and tools/gpu/fetch-wheels.sh: the gpu-labelled
# checks (GPU_CTEST=0 skips them), then examples/sleep_whole_process.py (model
# weights kept, a KV_GIB GiB cache dropped, a captured CUDA graph's pool,
# cuBLAS's workspace, a one-rank NCCL group) natively without a pause (the
# reference), under vmmshim and under torch_memory_saver with its own API,
# one uncounted warm-up run of each, then alternated ROUNDS times; every
# result line must equal the reference's. Writes $OUT/sleep-whole-process.log.
# usage: tools/gpu/sleep-whole-process.sh [ROUNDS]   (KV_GIB, WORK_GIB: default 16)
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
rounds=${1:-2}
exec > >(tee "$out/sleep-whole-process.log") 2>&1
gpu_header_and_checks
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
unpack_tms
app() { python3 "$root/examples/sleep_whole_process.py" --kv-gib "${KV_GIB:-16}" --work-gib "${WORK_GIB:-16}" "$@"; }
run() {  # run BACKEND: the program under that backend
  case $1 in
    vmmshim) LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info app --backend vmmshim ;;
    tms) LD_PRELOAD=$tms PYTHONPATH=$tms_dir:$PYTHONPATH app --backend tms ;;
    none) app --backend none ;;
  esac
}
backends="none vmmshim"
[ -n "$tms_dir" ] && backends="$backends tms"
for be in $backends; do run "$be" >/dev/null 2>&1; done  # warm-up, not reported
failures=0
ref=""
for ((i = 1; i <= rounds; i++)); do
  echo "== round $i"
  for be in $backends; do
    got=$(run "$be" 2>&1); rc=$?
    grep -E '^sleep_whole_process:|vmmshim_(pause|resume)_memory\(|exit report' <<<"$got" | sed "s/^/$be: /"
    res=$(grep '^result' <<<"$got")
    echo "$be: $res"
    [ "$be" = none ] && [ -z "$ref" ] && ref=$res
    if [ $rc != 0 ] || [ "$res" != "$ref" ]; then
      echo "$be round $i: RESULT DIFFERS from the native reference (exit $rc)"
      failures=$((failures + 1)); tail -25 <<<"$got"
    else
      echo "$be round $i: result identical to the native reference"
    fi
  done
done
echo "runs whose result differed: $failures"

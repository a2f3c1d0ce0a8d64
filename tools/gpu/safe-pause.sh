#!/usr/bin/env bash
# Ordinary work while paused, on a GPU host after tools/gpu/bundle.sh:
# examples/safe_pause.py under PyTorch's three allocator modes (default,
# expandable_segments:True, backend:cudaMallocAsync) and CuPy's default pool,
# each natively without a pause (the reference) and under vmmshim, with the
# six cycles (one tag, everything, everything but one tag; with and without
# contents). Prints one line per mode and cycle: identical to the reference
# or not, and the pause's and resume's bytes and seconds. Writes
# $OUT/safe-pause.log.
# usage: tools/gpu/safe-pause.sh   (KV_GIB default 8, UNTAGGED_GIB default 4;
#   SPLIT="default expandable async cupy" (any of them): those modes run each
#   cycle in a process of its own, to tell which one fails;
#   GPU_CTEST=1: the gpu-labelled checks first)
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/safe-pause.log") 2>&1
GPU_CTEST=${GPU_CTEST:-0} gpu_header_and_checks
python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__)'
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
cycles=(tag:keep tag:drop all:keep all:drop except:keep except:drop)
app() { python3 "$root/examples/safe_pause.py" --kv-gib "${KV_GIB:-8}" \
  --untagged-gib "${UNTAGGED_GIB:-4}" "$@"; }
failures=0
run_mode() {  # run_mode KEY NAME FRAMEWORK [PYTORCH_CUDA_ALLOC_CONF]
  local key=$1 name=$2 fw=$3 conf=${4:-} groups c ref got rc line want
  if [[ " ${SPLIT:-} " == *" $key "* ]]; then groups=("${cycles[@]}"); else groups=("$(IFS=,; echo "${cycles[*]}")"); fi
  for c in "${groups[@]}"; do
    ref=$(PYTORCH_CUDA_ALLOC_CONF=$conf app --framework "$fw" --no-pause --cycles "$c" 2>&1)
    rc=$?
    [ $rc = 0 ] || { echo "$name reference ($c) failed (exit $rc):"; tail -15 <<<"$ref"; failures=$((failures + 1)); continue; }
    got=$(PYTORCH_CUDA_ALLOC_CONF=$conf LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info app --framework "$fw" --cycles "$c" 2>&1)
    rc=$?
    for cycle in ${c//,/ }; do
      want=$(grep "^result $fw $cycle:" <<<"$ref")
      line=$(grep "^result $fw $cycle:" <<<"$got")
      m=$(grep "^measure .* $cycle: " <<<"$got" | sed 's/^measure [^ ]* [^ ]*: //' | paste -sd';' -)
      if [ -n "$line" ] && [ "$line" = "$want" ]; then
        echo "$name $cycle: identical to the never-paused run; $m"
      else
        echo "$name $cycle: DIFFERS from the never-paused run (exit $rc); $m"
        echo "  reference: $want"; echo "  vmmshim:   ${line:-(none)}"
        failures=$((failures + 1))
      fi
    done
    if [ $rc != 0 ]; then
      echo "$name ($c): exit $rc; the run's last lines:"
      grep -vE '^(result|measure)' <<<"$got" | tail -12 | sed 's/^/  /'
    fi
    grep -E 'vmmshim_(pause|resume)_memory\(' <<<"$got" | sed "s/^/  $name: /" >> "$out/safe-pause-shim-log.txt"
  done
}
run_mode default "torch default" torch ""
run_mode expandable "torch expandable_segments:True" torch "expandable_segments:True"
run_mode async "torch backend:cudaMallocAsync" torch "backend:cudaMallocAsync"
if python3 -c "import cupy" 2>/dev/null; then
  run_mode cupy "cupy default pool" cupy
else
  echo "cupy: not installed"
fi
echo "mode and cycle lines that differed or failed: $failures"

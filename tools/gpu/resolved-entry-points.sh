#!/usr/bin/env bash
# Which driver entry points real programs resolve under the shim, and which of them the
# submission gate holds (tools/gpu/resolved-entry-points.py classifies them): a static-cudart
# program (examples/alloc_mix), PyTorch through cuBLAS, cuDNN, NCCL and Triton
# (examples/torch_library_mix.py) and CuPy through cuBLAS and cuFFT
# (examples/cupy_libraries.py), each with VMMSHIM_LOG_LEVEL=debug. Writes
# $out/resolved-entry-points.log; exits 1 when a work-submitting entry point was handed out
# ungated.
# usage: tools/gpu/resolved-entry-points.sh   (after tools/gpu/bundle.sh, on a GPU host)
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/resolved-entry-points.log") 2>&1
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
logs=()
record() {  # NAME COMMAND...
  local name=$1; shift
  local log=$out/resolve-$name.debug
  rm -f "$log"
  if ! LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=debug VMMSHIM_LOG_FILE=$log "$@" > "$out/$name.stdout" 2>&1; then
    echo "$name: the program failed:"; tail -5 "$out/$name.stdout"
  fi
  logs+=("$name=$log")
}
record cudart "$b/examples/alloc_mix" 2
record torch python3 "$root/examples/torch_library_mix.py"
python3 -c "import cupy" 2>/dev/null && record cupy python3 "$root/examples/cupy_libraries.py"
python3 "$root/tools/gpu/resolved-entry-points.py" "$root/core/driver/work_submission.h" \
  /usr/local/cuda/include "${logs[@]}"
rc=$?
rm -f "$out"/resolve-*.debug
exit $rc

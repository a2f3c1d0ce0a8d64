#!/usr/bin/env bash
# torch_memory_saver's own test suite, and the pause and resume times of
# programs written for it, under torch_memory_saver 0.0.10 and through
# vmmshim's drop-in, on a GPU host (after tools/gpu/bundle.sh, which copies
# the suite into .gpu/peers, and tools/gpu/fetch-wheels.sh):
#   1. the suite through the drop-in (vmmshim run --torch-memory-saver), as
#      the suite's README runs it: $OUT/tms-suite-vmmshim.txt;
#   2. the times, alternated, ROUNDS rounds (default 2): rl_example's every
#      pause and resume (examples/tms_timed.py), and a retained-backup cycle
#      (4 GiB of weights, retain_cpu_backup, 4 cycles: the first apart);
#   3. the suite under torch_memory_saver 0.0.10 itself:
#      $OUT/tms-suite-torch_memory_saver.txt (SUITES=vmmshim skips it).
# Everything printed goes to $OUT/tms-suite.log.
# usage: tools/gpu/tms-suite.sh [ROUNDS]
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/tms-suite.log") 2>&1
rounds=${1:-2}
suite=$root/.gpu/peers/torch_memory_saver
[ -d "$suite/test" ] || { echo "no suite in $suite (tools/gpu/bundle.sh copies it)"; exit 1; }
unpack_tms
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, pytest; print("torch", torch.__version__, "pytest", pytest.__version__)'
pytest_args=(-q -rA -p no:cacheprovider test --continue-on-collection-errors
             --ignore=test/test_merge_cuda_wheels.py)
outcomes() {  # the per-test outcome lines and the summary of a pytest log
  grep -E '^(PASSED|FAILED|SKIPPED|ERROR) |[0-9]+ (passed|failed|skipped)' "$1"
}
tms_run() {  # MODE COMMAND...: under torch_memory_saver or the drop-in
  local mode=$1; shift
  if [ "$mode" = torch_memory_saver ]; then
    LD_PRELOAD=$tms PYTHONPATH=$tms_dir${PYTHONPATH:+:$PYTHONPATH} "$@"
  else
    "$b/vmmshim" run --torch-memory-saver -- "$@"
  fi
}

echo "== the suite through vmmshim's drop-in"
start=$(date +%s)
(cd "$suite" && timeout 300 "$b/vmmshim" run --torch-memory-saver -- python3 -m pytest \
   "${pytest_args[@]}") > "$out/tms-suite-vmmshim.txt" 2>&1
echo "exit $? in $(( $(date +%s) - start )) s"
outcomes "$out/tms-suite-vmmshim.txt"

if [ -n "$tms_dir" ]; then
  echo "== pause and resume times (s), alternated, $rounds rounds"
  for ((i = 1; i <= rounds; i++)); do
    for mode in torch_memory_saver vmmshim; do
      for what in rl_example retained; do
        got=$(cd "$suite" && tms_run "$mode" timeout 120 python3 "$root/examples/tms_timed.py" \
              "$what" "$suite" 2>&1)
        echo "$mode round $i $what (exit $?):"
        grep '^tms_timed:' <<<"$got" | sed 's/^tms_timed: /  /'
        grep -q '^tms_timed: result' <<<"$got" || tail -20 <<<"$got"
      done
    done
  done
fi

if [ -n "$tms_dir" ] && [ "${SUITES:-both}" != vmmshim ]; then
  echo "== the suite under torch_memory_saver $(basename "$(ls "$root"/.gpu/wheels/torch_memory_saver-*.whl)")"
  start=$(date +%s)
  (cd "$suite" && PYTHONPATH=$tms_dir timeout "${TMS_SUITE_TIMEOUT:-280}" python3 -m pytest \
     "${pytest_args[@]}") > "$out/tms-suite-torch_memory_saver.txt" 2>&1
  echo "exit $? in $(( $(date +%s) - start )) s"
  outcomes "$out/tms-suite-torch_memory_saver.txt"
fi

#!/usr/bin/env bash
# Sleeping and pausing a process while it works, on a GPU host after
# tools/gpu/bundle.sh: examples/busy_workload.py (bf16 matmuls on one thread,
# host <-> device copies on a side stream on another, a fixed number of
# steps, so that its final result line is deterministic) under the shim,
# for each of PyTorch's allocator modes (PYTORCH_CUDA_ALLOC_CONF unset,
# expandable_segments:True, backend:cudaMallocAsync):
#   (a) reference  a run nobody sleeps or pauses: its result line;
#   (b) slept      put to sleep from outside and woken CYCLES times (default
#                  10) at random moments (0.3-1.5 s of work between cycles,
#                  from SEED, printed): `vmmshim sleep PID`, the MiB nvidia-smi
#                  lists for it while asleep, `vmmshim wake PID`; one line a
#                  cycle:
#                    mode M cycle I: sleep RC S s (OUTPUT), asleep MIB MiB, wake RC S s
#                  then its result against the reference (identical or
#                  DIFFERS), its exit status and its faults (a nonzero status
#                  of a sleep or wake, MiB held while asleep, a different
#                  result, copy mismatches, a run that ended before CYCLES
#                  cycles: give it more STEPS);
#   (c) paused     the program's own thread pausing everything and resuming
#                  it PAUSES times (default 20; --pause-thread), result
#                  against the reference.
# And a native run (no LD_PRELOAD, default mode) whose result must equal the
# shim's reference. Ends with a summary table; exits nonzero when anything
# failed. Every run's stdout and stderr are kept in $OUT/busy-sleep/; the
# log is $OUT/busy-sleep.log.
# usage: tools/gpu/busy-sleep.sh
#   CYCLES (10), PAUSES (20), STEPS (the workload's --steps, 5000: 19-25 s
#   of work on an H100 with nobody pausing it), SEED (default $RANDOM),
#   MODES (default "default expandable async": a subset to run),
#   RUN_TIMEOUT (900: seconds a run may take before it is killed),
#   SLEEP_GAP_MS (300,1500: work between sleeps, ms), PAUSE_GAP_MS and
#   PAUSE_HOLD_MS (the workload's --pause-gap-ms, --pause-hold-ms),
#   REFERENCE (each: a reference run under the shim per mode; native: the
#   native run is every mode's reference, one run instead of three).
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/busy-sleep.log") 2>&1
seed=${SEED:-$RANDOM}
RANDOM=$seed
cycles=${CYCLES:-10} pauses=${PAUSES:-20} steps=${STEPS:-5000} limit=${RUN_TIMEOUT:-900}
gap=${SLEEP_GAP_MS:-300,1500} gap_lo=${gap%,*} gap_hi=${gap#*,}
pause_args=(--pause-gap-ms "${PAUSE_GAP_MS:-200,1000}" --pause-hold-ms "${PAUSE_HOLD_MS:-50,300}")
runs=$out/busy-sleep
rm -rf "$runs" && mkdir -p "$runs"
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
app=(python3 "$root/examples/busy_workload.py" --steps "$steps")
[ -f "$shim" ] && [ -x "$b/vmmshim" ] || { echo "$shim or $b/vmmshim was not built"; exit 1; }

started=()  # every workload process started; none is left behind
cleanup() {
  local p
  for p in "${started[@]}"; do kill -9 "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
echo "seed $seed (SEED=$seed repeats the moments), steps $steps, cycles $cycles, pauses $pauses"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }'; }
oneline() { tr '\n' ' ' <<<"$1" | sed 's/ *$//'; }
# The shim's state of process $1: running, sleeping, asleep, not-answering,
# none (no control socket), gone (exited) or unknown.
state() {
  alive "$1" || { echo gone; return; }
  timeout 30 "$b/vmmshim" ps --json 2>/dev/null | python3 -c 'import json, sys
p = [e for e in json.load(sys.stdin) if e.get("pid") == int(sys.argv[1])]
print(p[0].get("state", "unknown").replace(" ", "-") if p else "none")' "$1" 2>/dev/null ||
    echo unknown
}
# start_app NAME CONF PRELOAD(0|1) ARGS...: the workload in the background,
# stdout and stderr to $runs/NAME.{out,err}; sets pid, app_out, app_err.
start_app() {
  local name=$1 conf=$2 preload=$3
  shift 3
  local env=(env -u PYTORCH_CUDA_ALLOC_CONF)
  [ -n "$conf" ] && env+=("PYTORCH_CUDA_ALLOC_CONF=$conf")
  [ "$preload" = 1 ] && env+=("LD_PRELOAD=$shim")
  app_out=$runs/$name.out app_err=$runs/$name.err app_start=$SECONDS
  "${env[@]}" "${app[@]}" "$@" >"$app_out" 2>"$app_err" &
  pid=$!
  started+=("$pid")
}
# Until the workload prints "ready" (300 s at most); 1 if it did not.
wait_ready() {
  local t
  for ((t = 0; t < 1500; t++)); do
    grep -q '^ready ' "$app_out" 2>/dev/null && return 0
    alive "$pid" || return 1
    sleep 0.2
  done
  return 1
}
# Until the workload ends (killed RUN_TIMEOUT s after its start); sets rc and
# result, and shows the end of its stderr when it failed.
finish_app() {
  while alive "$pid" && ((SECONDS - app_start < limit)); do sleep 0.5; done
  if alive "$pid"; then
    echo "  not finished $limit s after its start: killed (RUN_TIMEOUT)"
    kill -9 "$pid" 2>/dev/null
  fi
  wait "$pid"
  rc=$?
  result=$(grep '^result ' "$app_out" | tail -1)
  if [ "$rc" != 0 ] || [ -z "$result" ]; then
    echo "  exit $rc; the end of its stderr ($app_err):"
    grep -v '^\[vmmshim.*info' "$app_err" | tail -20 | sed 's/^/    /'
  fi
}
# The result line's fault, if any, against reference $1: prints identical or
# DIFFERS; returns 1 for a difference or copy mismatches.
compare() {
  if [ -n "$result" ] && [ "$result" = "$1" ]; then
    echo identical
  else
    echo DIFFERS
    return 1
  fi
  [[ $result == *" mismatches 0" ]]
}

failures=0
rows=()
declare -A ref

# The native reference (default mode), then per mode (a), (b), (c).
echo "== native (no LD_PRELOAD), default allocator"
start_app native-default "" 0
finish_app
native=$result native_rc=$rc
echo "native: ${native:-(no result)} (exit $rc); $(grep '^elapsed' "$app_out")"

for key in ${MODES:-default expandable async}; do
  case $key in
    default) conf="" ;;
    expandable) conf="expandable_segments:True" ;;
    async) conf="backend:cudaMallocAsync" ;;
    *) echo "unknown mode $key (MODES: default expandable async)"; exit 2 ;;
  esac
  m=${conf:-default}
  echo "== mode $m"

  # (a) The reference under the shim (or the native run's, REFERENCE=native).
  if [ "${REFERENCE:-each}" = native ]; then
    result=$native rc=$native_rc
  else
    start_app "$key-reference" "$conf" 1
    finish_app
  fi
  ref[$key]=$result
  ref_rc=$rc
  echo "mode $m reference: ${result:-(no result)} (exit $rc); $(grep '^elapsed' "$app_out")"
  [ "$rc" = 0 ] && [ -n "$result" ] && [[ $result == *" mismatches 0" ]] ||
    { echo "mode $m: the reference run failed"; failures=$((failures + 1)); }
  if [ "$key" = default ] && [ "${REFERENCE:-each}" != native ]; then
    if [ -n "$native" ] && [ "$native" = "$result" ] && [ "$native_rc" = 0 ]; then
      native_verdict=identical
    else
      native_verdict=DIFFERS; failures=$((failures + 1))
    fi
    echo "native against the shim's reference: $native_verdict"
  fi

  # (b) Slept and woken from outside CYCLES times.
  start_app "$key-slept" "$conf" 1
  made=0 faults=0
  if ! wait_ready; then
    echo "mode $m: the slept run did not start"; faults=$((faults + 1))
  else
    for ((i = 1; i <= cycles; i++)); do
      delay=$((gap_lo + RANDOM % (gap_hi - gap_lo + 1)))
      sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
      if ! alive "$pid"; then
        echo "mode $m: the process ended after $made cycles, before cycle $i of $cycles" \
             "(give it more STEPS)"
        faults=$((faults + 1)); break
      fi
      t0=$(now); s=$(timeout 120 "$b/vmmshim" sleep "$pid" 2>&1); src=$?; ts=$(since "$t0")
      asleep=$(held "$pid")
      if [ $src = 0 ]; then st=asleep; else st=$(state "$pid"); fi
      case $st in
        gone)
          echo "mode $m cycle $i: sleep $src $ts s ($(oneline "$s")): the process ended" \
               "(give it more STEPS)"
          faults=$((faults + 1)); break ;;
        running | none) wrc=skipped tw=0.000 w="not asleep ($st): no wake" ;;
        *) t0=$(now); w=$(timeout 120 "$b/vmmshim" wake "$pid" 2>&1); wrc=$?; tw=$(since "$t0") ;;
      esac
      made=$((made + 1))
      echo "mode $m cycle $i: sleep $src $ts s ($(oneline "$s")), asleep $asleep MiB," \
           "wake $wrc $tw s (after $(printf '%d.%03d' $((delay / 1000)) $((delay % 1000))) s of work)"
      [ $src = 0 ] || faults=$((faults + 1))
      [ "$asleep" = 0 ] || faults=$((faults + 1))
      if [ "$wrc" != 0 ]; then
        echo "  wake: $(oneline "$w")"
        [ "$wrc" = skipped ] || faults=$((faults + 1))
        st=$(state "$pid")
        case $st in
          asleep | sleeping | not-answering | unknown)
            w=$(timeout 120 "$b/vmmshim" wake "$pid" 2>&1)
            echo "  woken again: exit $?: $(oneline "$w")"
            st=$(state "$pid")
            if [ "$st" != running ] && [ "$st" != gone ]; then
              echo "  still $st: killed"; kill -9 "$pid" 2>/dev/null; break
            fi ;;
        esac
      fi
    done
  fi
  finish_app
  verdict=$(compare "${ref[$key]}") || faults=$((faults + 1))
  [ "$rc" = 0 ] || faults=$((faults + 1))
  echo "mode $m slept: result $verdict (${result:-no result}), exit $rc, $made of $cycles cycles," \
       "$faults faults"
  [ $faults = 0 ] || failures=$((failures + 1))
  slept_row="$made/$cycles cycles, $faults faults, $verdict, exit $rc"

  # (c) Paused by its own thread PAUSES times.
  start_app "$key-paused" "$conf" 1 --pause-thread "$pauses" --pause-seed "$seed" "${pause_args[@]}"
  finish_app
  grep '^pause cycle [0-9]' "$app_out" | sed "s/^/mode $m /"
  during=$(sed -n 's/^pause cycles [0-9]*, \([0-9]*\) during the work$/\1/p' "$app_out")
  pfaults=0
  verdict=$(compare "${ref[$key]}") || pfaults=$((pfaults + 1))
  [ "$rc" = 0 ] || pfaults=$((pfaults + 1))
  if [ "${during:-0}" != "$pauses" ]; then
    echo "mode $m paused: ${during:-0} of $pauses pauses came while it worked (more STEPS or fewer PAUSES)"
    pfaults=$((pfaults + 1))
  fi
  echo "mode $m paused: result $verdict (${result:-no result}), exit $rc, ${during:-0} of $pauses" \
       "pauses during the work, $pfaults faults"
  [ $pfaults = 0 ] || failures=$((failures + 1))
  rows+=("$(printf '%-26s %-8s %-44s %s' "$m" "$([ "$ref_rc" = 0 ] && echo ok || echo "exit $ref_rc")" \
            "$slept_row" "${during:-0}/$pauses during work, $pfaults faults, $verdict, exit $rc")")
done

echo
echo "== summary (seed $seed, steps $steps)"
echo "native, default allocator: ${native:-no result} (exit $native_rc):" \
     "${native_verdict:-not compared} to the shim's reference"
printf '%-26s %-8s %-44s %s\n' "allocator" "ref" "slept and woken" "paused by its own thread"
for r in "${rows[@]}"; do echo "$r"; done
echo "runs' output: $runs"
if [ $failures != 0 ]; then echo "FAILED: $failures"; exit 1; fi
echo "all passed"

#!/usr/bin/env bash
# Deep sleep on a GPU host (after tools/gpu/bundle.sh): examples/deep_sleep_workload.py
# (1 GiB of weights, a KV cache of KV_GIB, default 16) put to sleep and woken
# six ways, alternated, ROUNDS rounds (default 2):
#   driver             natively, the driver's checkpoint alone (tools/gpu/driver_checkpoint.py,
#                      as cuda-checkpoint calls it);
#   vmmshim            under the shim, `vmmshim sleep PID` (everything kept), `vmmshim wake PID`;
#   vmmshim-pool       the same with a pinned pool of POOL (default 20G) for the copies;
#   vmmshim-pool-stack the same with VMMSHIM_SLEEP_LOWERS_STACK=0: the contexts' stack
#                      reservation left for the checkpoint to copy;
#   vmmshim-drop       `vmmshim sleep PID --drop kv` (the KV cache refilled after the wake);
#   vmmshim-drop-pool  the same with a pinned pool of DROP_POOL (default 3G: the weights);
#   baseline           as vmmshim, with the shim of BASELINE (a build of
#                      tools/build/build-baseline.sh; default: the only one there).
# MODES=driver,vmmshim,... picks some (default: the first six).
# A process with a pool is given 3 s after it is ready before its sleep: the
# pool is made in the background from its first allocation (about 1.2 s for
# 20 GiB), which a real program's start covers.
# Each run: the result before, the sleep's seconds, the device memory the
# process holds while asleep (nvidia-smi's per-process figure, MiB), the
# wake's seconds, the result after (identical to before, and to the run that
# never slept). Then time-sharing (TIMESHARE=0 skips it): two processes of
# about 100 GiB each (8 GiB of weights, a 92 GiB KV cache) on one GPU, started
# in turn and alternated by `vmmshim sleep --drop kv` and `vmmshim wake`
# CYCLES times (default 3), each one's result after every wake equal to its
# result before the first sleep. Writes $OUT/deep-sleep.log.
# usage: tools/gpu/deep-sleep.sh [ROUNDS]
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/deep-sleep.log") 2>&1
rounds=${1:-2}
MODES=${MODES:-driver,vmmshim,vmmshim-pool,vmmshim-pool-stack,vmmshim-drop,vmmshim-drop-pool}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
app=(python3 "$root/examples/deep_sleep_workload.py" --kv-gib "${KV_GIB:-16}")
run() {  # MODE ROUND
  local mode=$1 round=$2 pid before after asleep s w pool=0 drop=() stack=1
  case $mode in
    vmmshim-pool) pool=${POOL:-20G} ;;
    vmmshim-pool-stack) pool=${POOL:-20G}; stack=0 ;;
    vmmshim-drop) drop=(--drop kv) ;;
    vmmshim-drop-pool) pool=${DROP_POOL:-3G}; drop=(--drop kv) ;;
  esac
  local preload=$shim
  [ "$mode" = baseline ] && preload=${BASELINE:-$(ls "$b"/baseline/libvmmshim-*.so | head -1)}
  coproc W { if [ "$mode" = driver ]; then exec "${app[@]}"; else
             LD_PRELOAD=$preload VMMSHIM_PINNED_POOL=$pool VMMSHIM_SLEEP_LOWERS_STACK=$stack \
               exec "${app[@]}"; fi; }
  read -r -t 120 line <&"${W[0]}"; pid=${line#ready }
  [ "$pool" = 0 ] || sleep 3
  echo result >&"${W[1]}"; read -r -t 60 before <&"${W[0]}"
  local awake; awake=$(held "$pid")
  if [ "$mode" = driver ]; then s=$(python3 "$root/tools/gpu/driver_checkpoint.py" sleep "$pid")
  else s=$("$b/vmmshim" sleep "$pid" "${drop[@]}" 2>&1); fi
  asleep=$(held "$pid")
  case $mode in
    driver) w=$(python3 "$root/tools/gpu/driver_checkpoint.py" wake "$pid") ;;
    *) w=$("$b/vmmshim" wake "$pid" 2>&1) ;;
  esac
  if [ ${#drop[@]} -gt 0 ]; then echo refill >&"${W[1]}"; read -r -t 60 _ <&"${W[0]}"; fi
  echo result >&"${W[1]}"; read -r -t 60 after <&"${W[0]}"
  echo quit >&"${W[1]}"; wait "$W_PID" 2>/dev/null
  [ "$mode" = baseline ] && mode="baseline $(basename "$preload")"
  echo "$mode (pool $pool) round $round: MiB awake $awake, asleep $asleep; sleep: $s; wake: $w"
  echo "  before: $before"; echo "  after:  $after"
  [ "$before" = "$after" ] && echo "  identical" || echo "  DIFFERS"
}
for ((i = 1; i <= rounds; i++)); do
  for mode in ${MODES//,/ }; do
    run "$mode" "$i"
  done
done

[ "${TIMESHARE:-1}" = 1 ] || exit 0
echo "== time-sharing: two processes of about 100 GiB, ${CYCLES:-3} cycles, pinned pools of ${TIMESHARE_POOL:-0}"
big=(python3 "$root/examples/deep_sleep_workload.py" --weights-gib 8 --kv-gib 92)
pool=${TIMESHARE_POOL:-0}
coproc A { LD_PRELOAD=$shim VMMSHIM_PINNED_POOL=$pool exec "${big[@]}"; }
read -r -t 300 line <&"${A[0]}"; a=${line#ready }
echo result >&"${A[1]}"; read -r -t 120 a_ref <&"${A[0]}"
"$b/vmmshim" sleep "$a" --drop kv
# A second coprocess: bash allows one at a time by name, so B talks through fifos.
fifo=$(mktemp -d); mkfifo "$fifo/in" "$fifo/out"
LD_PRELOAD=$shim VMMSHIM_PINNED_POOL=$pool "${big[@]}" < "$fifo/in" > "$fifo/out" & bpid=$!
exec {b_in}>"$fifo/in" {b_out}<"$fifo/out"
read -r -t 300 line <&"$b_out"; bp=${line#ready }
echo result >&"$b_in"; read -r -t 120 b_ref <&"$b_out"
for ((c = 1; c <= ${CYCLES:-3}; c++)); do
  "$b/vmmshim" sleep "$bp" --drop kv
  "$b/vmmshim" wake "$a"
  echo refill >&"${A[1]}"; read -r -t 120 _ <&"${A[0]}"
  echo result >&"${A[1]}"; read -r -t 120 got <&"${A[0]}"
  [ "$got" = "$a_ref" ] && echo "cycle $c: A identical" || echo "cycle $c: A DIFFERS: $got"
  "$b/vmmshim" sleep "$a" --drop kv
  "$b/vmmshim" wake "$bp"
  echo refill >&"$b_in"; read -r -t 120 _ <&"$b_out"
  echo result >&"$b_in"; read -r -t 120 got <&"$b_out"
  [ "$got" = "$b_ref" ] && echo "cycle $c: B identical" || echo "cycle $c: B DIFFERS: $got"
done
# B ends first: A's memory needs the GPU B holds.
echo quit >&"$b_in"; wait "$bpid" 2>/dev/null
"$b/vmmshim" wake "$a"
echo quit >&"${A[1]}"; wait "$A_PID" 2>/dev/null
rm -rf "$fifo"

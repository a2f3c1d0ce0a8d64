#!/usr/bin/env bash
# Paused memory that stays addressable, on a GPU host (after tools/gpu/bundle.sh),
# into $out/addressable-pause.log (docs/data/addressable-pause-<gpu>.log):
#   1. the driver alone: bench/host_vmm_costs 4 CHUNK_MIB (default 64: the size of the
#      shim's larger blocks) (host cuMemCreate by 1-16 threads, partial and offset maps, the
#      remap at a device allocation's address, host mappings with the device's access by
#      1-16 threads, the swap beside a running copy, kernel and CPU access, one scratch
#      granule mapped over a range);
#   2. examples/paused_access.py under PyTorch's three allocator modes:
#      kernels, a graph and an optimizer step on paused tensors, compared bit for bit with
#      a never-paused run, and the kernels' GiB/s on paused memory;
#   3. the driver's checkpoint of a process holding host VMM memory, beside none and a
#      cuMemHostRegister'ed pool (tools/gpu/checkpoint_host_memory.py);
#   4. bench/pause_bandwidth.py: a trainer's 16 GiB (GIB) in PyTorch's three allocator
#      modes, the defaults (addressable, its host memory made in the background after the
#      first pause) and host made by the first pause, against fault (CONFIGS),
#      ROUNDS rounds of 3 cycles each (the first cycle apart); WORKLOADS picks some;
#   5. a deep sleep after host-mode pauses (tests/gpu/sleep_after_paused_access.py: a
#      tag paused with contents is refused; the scratch a dropped pause kept is released
#      and the process wakes; no pause before).
#   6. with BASELINE_SHIM (another build's libvmmshim.so): bench/pause_bandwidth.py's
#      BASELINE_WORKLOADS (default mixed-expandable) under the defaults, this bundle's
#      library and BASELINE_SHIM alternated, ROUNDS rounds each.
# STEPS=1,2,3,4,5 picks steps (6 runs when BASELINE_SHIM is set).
# usage: tools/gpu/addressable-pause.sh [ROUNDS]
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
rounds=${1:-2} steps=${STEPS:-1,2,3,4,5}
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
log=$out/addressable-pause.log
step() { [[ ",$steps," == *",$1,"* ]]; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  if step 1; then
    echo "== bench/host_vmm_costs 4 ${CHUNK_MIB:-64}"
    timeout 120 "$b/bench/host_vmm_costs" 4 "${CHUNK_MIB:-64}" 2>&1; echo "rc=$?"
  fi
  if step 2; then
    for conf in "" backend:cudaMallocAsync expandable_segments:True; do
      echo "== examples/paused_access.py --gib 4 (${conf:-default allocator})"
      timeout 200 env LD_PRELOAD="$shim" PYTORCH_CUDA_ALLOC_CONF="$conf" VMMSHIM_LOG_LEVEL=info \
        VMMSHIM_PAUSED_ACCESS=host VMMSHIM_HOST_POOL_MAKE=pause \
        python3 "$root/examples/paused_access.py" --gib 4 2>&1 |
        grep -E "^paused-access|_memory\(|rror"
      echo "rc=${PIPESTATUS[0]}"
    done
  fi
  if step 3; then
    echo "== tools/gpu/checkpoint_host_memory.py --gib 4 --rounds 1 --ways none,register,vmm_host"
    timeout 200 python3 "$root/tools/gpu/checkpoint_host_memory.py" --gib 4 --rounds 1 \
      --ways none,register,vmm_host 2>&1; echo "rc=$?"
  fi
  if step 4; then
    workloads=${WORKLOADS:-mixed,mixed-async,mixed-expandable}
    echo "== bench/pause_bandwidth.py --gib ${GIB:-16} --rounds $rounds --workloads $workloads --configs ${CONFIGS:-default,host,fault}"
    timeout 560 python3 "$root/bench/pause_bandwidth.py" --shim "$shim" --rounds "$rounds" \
      --cycles 3 --gib "${GIB:-16}" --workloads "$workloads" \
      --configs ${CONFIGS:-default,host,fault} 2>&1; echo "rc=$?"
  fi
  if step 5; then
    for mode in kept dropped none; do
      echo "== tests/gpu/sleep_after_paused_access.py $mode (host memory made by the pause)"
      timeout 120 env LD_PRELOAD="$shim" VMMSHIM_PAUSED_ACCESS=host VMMSHIM_HOST_POOL_MAKE=pause \
        VMMSHIM_LOG_LEVEL=info \
        python3 "$root/tests/gpu/sleep_after_paused_access.py" $mode 2>&1 |
        grep -E "^sleep-after|for the checkpoint|rror"
      echo "rc=${PIPESTATUS[0]}"
    done
  fi
  if [ -n "${BASELINE_SHIM:-}" ]; then
    for ((r = 1; r <= rounds; ++r)); do
      for lib in "$shim" "$BASELINE_SHIM"; do
        echo "== bench/pause_bandwidth.py --shim $lib --rounds 1 (round $r)"
        timeout 300 python3 "$root/bench/pause_bandwidth.py" --shim "$lib" --rounds 1 \
          --cycles 3 --gib "${GIB:-16}" --workloads "${BASELINE_WORKLOADS:-mixed-expandable}" \
          --configs default 2>&1; echo "rc=$?"
      done
    done
  fi
} 2>&1 | tee "$log"

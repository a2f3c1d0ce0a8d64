#!/usr/bin/env bash
# Real-GPU checks of the shim (ctest label "gpu"). Each compares a run under
# LD_PRELOAD=libvmmshim.so with a native run of the same program.
# Exits 77 (ctest: skipped) with the reason where there is no GPU.
# usage: gpu_check.sh CHECK BUILD_DIR SOURCE_DIR
set -uo pipefail
check=$1 build=$2 src=$3
shim=$build/libvmmshim.so

if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "SKIP: no NVIDIA GPU on this machine (nvidia-smi -L lists none); the gpu-labelled" \
       "checks run on a GPU host, see docs/validation.md"
  exit 77
fi
need() { [ -x "$1" ] || { echo "SKIP: $1 was not built (nvcc missing at configure time)"; exit 77; }; }
have_torch() {
  python3 -c "import torch" 2>/dev/null || { echo "SKIP: PyTorch is not installed"; exit 77; }
}
fail() { echo "FAIL: $*"; exit 1; }
under_shim() { LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info "$@"; }
# Runs a program natively and under the shim (each must exit 0), shows both
# outputs and requires their PROBE lines to be identical. Sets $native and
# $shimmed.
probe_pair() {
  native=$("$@" 2>&1) || fail "native: $native"
  shimmed=$(under_shim "$@" 2>&1) || fail "shim: $shimmed"
  echo "$native" | sed 's/^/native /'; echo "$shimmed" | grep -v '^\[vmmshim' | sed 's/^/shim   /'
  diff <(grep ^PROBE <<<"$native") <(grep ^PROBE <<<"$shimmed") ||
    fail "PROBE lines differ (left: native, right: shim)"
}
served() { grep -oE 'served [0-9]+ allocations' <<<"$1" | grep -oE '[0-9]+'; }
passed_through() { grep -oE 'passed [0-9]+ allocations' <<<"$1" | grep -oE '[0-9]+'; }
# held PID (its MiB on nvidia-smi) and alive PID.
source "$src/tools/gpu/process-state.sh"

case $check in
  static_cudart)
    bin=$build/examples/alloc_mix; need "$bin"
    if ldd "$bin" | grep -q libcudart; then fail "alloc_mix links cudart dynamically"; fi
    native=$("$bin" 2 2>&1) || fail "native run: $native"
    shimmed=$(under_shim "$bin" 2 2>&1) || fail "shim run: $shimmed"
    echo "native: $native"; echo "shim:   $shimmed"
    [ "$(grep alloc_mix: <<<"$native")" = "$(grep alloc_mix: <<<"$shimmed")" ] || fail "results differ"
    want=$(grep -oE 'alloc_mix: [0-9]+ allocations' <<<"$shimmed" | grep -oE '[0-9]+')
    n=$(served "$shimmed"); [ "${n:-0}" = "$want" ] || fail "${n:-0} of $want allocations served from VMM"
    [ "$(passed_through "$shimmed")" = 0 ] || fail "allocations were passed through"
    off=$(LD_PRELOAD=$shim VMMSHIM_ENABLE=0 VMMSHIM_LOG_LEVEL=info "$bin" 1 2>&1) || fail "$off"
    echo "VMMSHIM_ENABLE=0: $off"
    grep -q "exit report" <<<"$off" && fail "VMMSHIM_ENABLE=0 still served allocations"
    ;;
  cudart_like)
    bin=$build/tests/e2e/cudart_like; need "$bin"
    out=$(LD_PRELOAD=$shim "$bin" vmm 2>&1) || fail "$out"
    echo "shim: $out"
    grep -q "real driver" <<<"$out" || fail "did not run on the real driver"
    out=$(LD_PRELOAD=$shim VMMSHIM_ENABLE=0 "$bin" native 2>&1) || fail "$out"
    echo "VMMSHIM_ENABLE=0: $out"
    ;;
  parity)
    bin=$build/examples/parity_probe; need "$bin"
    native=$("$bin" 2>&1); shimmed=$(LD_PRELOAD=$shim "$bin" 2>&1)
    echo "$shimmed" | grep INFO | sed 's/^/shim   /'; echo "$native" | grep INFO | sed 's/^/native /'
    if ! diff <(grep ^PARITY <<<"$native") <(grep ^PARITY <<<"$shimmed"); then
      fail "return codes or out-parameters differ (left: native, right: shim)"
    fi
    echo "$(grep -c ^PARITY <<<"$native") PARITY lines identical"
    # The shim's own peer-access state machine (the driver not called).
    emulated=$(LD_PRELOAD=$shim VMMSHIM_PEER_ENABLE_DRIVER=0 "$bin" 2>&1)
    if ! diff <(grep ^PARITY <<<"$native") <(grep ^PARITY <<<"$emulated"); then
      fail "codes differ with VMMSHIM_PEER_ENABLE_DRIVER=0 (left: native, right: shim)"
    fi
    echo "identical with VMMSHIM_PEER_ENABLE_DRIVER=0 too"
    ;;
  footprint)
    bin=$build/examples/footprint; need "$bin"
    native=$("$bin" 10000 256) || fail "$native"
    shimmed=$(LD_PRELOAD=$shim "$bin" 10000 256) || fail "$shimmed"
    echo "native: $native"; echo "shim:   $shimmed"
    n=$(grep -oE 'used [0-9.]+' <<<"$native" | grep -oE '[0-9.]+')
    s=$(grep -oE 'used [0-9.]+' <<<"$shimmed" | grep -oE '[0-9.]+')
    awk -v n="$n" -v s="$s" 'BEGIN { exit !(s <= 2 * n + 2) }' || fail "shim uses $s MiB vs native $n MiB"
    ;;
  driver_api)
    bin=$build/examples/driver_api_demo; need "$bin"
    out=$(under_shim "$bin" 2>&1) || fail "$out"
    echo "$out"
    [ "$(served "$out")" -ge 1000 ] || fail "driver-API allocations not served from VMM"
    ;;
  torch)
    have_torch
    native=$(python3 "$src/examples/train_mlp.py" 2>&1) || fail "native: $native"
    shimmed=$(under_shim python3 "$src/examples/train_mlp.py" 2>&1) || fail "shim: $shimmed"
    nocache=$(PYTORCH_NO_CUDA_MEMORY_CACHING=1 under_shim python3 "$src/examples/train_mlp.py" 2>&1) ||
      fail "shim without caching: $nocache"
    echo "native:                    $(grep train_mlp: <<<"$native")"
    echo "shim:                      $(grep train_mlp: <<<"$shimmed")"
    echo "shim, no torch caching:    $(grep train_mlp: <<<"$nocache")"
    grep 'exit report' <<<"$shimmed"; grep 'exit report' <<<"$nocache"
    [ "$(grep train_mlp: <<<"$native")" = "$(grep train_mlp: <<<"$shimmed")" ] || fail "checksums differ"
    [ "$(grep train_mlp: <<<"$native")" = "$(grep train_mlp: <<<"$nocache")" ] || fail "checksums differ (no caching)"
    [ "$(served "$shimmed")" -gt 0 ] || fail "PyTorch allocations not served from VMM"
    [ "$(passed_through "$shimmed")" = 0 ] || fail "PyTorch allocations passed through"
    ;;
  torch_graph)
    # Allocations during a CUDA graph capture (PyTorch's private pool),
    # in each capture mode: identical weights natively and under the shim.
    have_torch
    for mode in global thread_local relaxed; do
      native=$(python3 "$src/examples/torch_graph.py" --capture-error-mode $mode 2>&1) ||
        fail "native ($mode): $native"
      shimmed=$(under_shim python3 "$src/examples/torch_graph.py" --capture-error-mode $mode 2>&1) ||
        fail "shim ($mode): $shimmed"
      echo "native: $(grep torch_graph: <<<"$native")"
      echo "shim:   $(grep torch_graph: <<<"$shimmed")"
      grep 'exit report' <<<"$shimmed"
      [ "$(grep torch_graph: <<<"$native")" = "$(grep torch_graph: <<<"$shimmed")" ] ||
        fail "checksums differ ($mode)"
      [ "$(served "$shimmed")" -gt 0 ] || fail "PyTorch allocations not served from VMM"
    done
    ;;
  torch_cpu_import)
    have_torch
    cmd='import torch; print("torch", torch.__version__, torch.ones(3).sum().item())'
    native=$(python3 -c "$cmd" 2>&1); rn=$?
    shimmed=$(LD_PRELOAD=$shim python3 -c "$cmd" 2>&1); rs=$?
    echo "native ($rn): $native"; echo "shim   ($rs): $shimmed"
    [ "$native" = "$shimmed" ] && [ $rn = $rs ] || fail "CPU-only import torch behaves differently"
    ;;
  policies)
    # The foundation examples under every peer policy give the native results.
    bin=$build/examples/alloc_mix; need "$bin"
    native=$("$bin" 1 2>&1 | grep alloc_mix:) || fail "native alloc_mix"
    torch_native=""
    if python3 -c "import torch" 2>/dev/null; then
      torch_native=$(python3 "$src/examples/train_mlp.py" --steps 100 2>&1 | grep train_mlp:)
    fi
    for policy in all none min-size rules; do
      env=(VMMSHIM_PEER_POLICY=$policy)
      [ $policy = min-size ] && env+=(VMMSHIM_PEER_MIN_BYTES=1M)
      [ $policy = rules ] && env+=(VMMSHIM_CONFIG=$src/tests/e2e/rules_kv.toml)
      out=$(env "${env[@]}" LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info "$bin" 1 2>&1) ||
        fail "alloc_mix under $policy: $out"
      [ "$(grep alloc_mix: <<<"$out")" = "$native" ] || fail "alloc_mix differs under $policy"
      echo "$policy: $(grep -m1 'peer-access policy' <<<"$out" | sed 's/.*policy: //')"
      echo "  alloc_mix: $(grep alloc_mix: <<<"$out")"
      if [ -n "$torch_native" ]; then
        t=$(env "${env[@]}" LD_PRELOAD=$shim python3 "$src/examples/train_mlp.py" --steps 100 2>&1 | grep train_mlp:)
        [ "$t" = "$torch_native" ] || fail "train_mlp differs under $policy: $t vs $torch_native"
        echo "  $t"
      fi
    done
    ;;
  stats)
    bin=$build/examples/alloc_mix; need "$bin"
    dir=$(mktemp -d)
    out=$(LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info VMMSHIM_STATS_FILE=$dir/stats.%p.json "$bin" 1 2>&1) ||
      fail "$out"
    grep 'exit report' <<<"$out"
    python3 - "$dir" <<'PY' || fail "bad statistics file"
import json, os, sys
d = sys.argv[1]
(name,) = os.listdir(d)
doc = json.load(open(os.path.join(d, name)))
dev = doc["devices"][0]
calls = {c["entry"]: c for c in doc["driver_calls"]}
print(name, "devices", len(doc["devices"]), "allocations", dev["allocations"],
      "peak physical", dev["peak_physical_bytes"], "cuMemCreate", calls["cuMemCreate"],
      "cuMemSetAccess", calls["cuMemSetAccess"])
assert dev["allocations"] == doc["totals"]["served_allocations"] > 3000
PY
    rm -rf "$dir"
    ;;
  ipc)
    # Two processes share buffers through cudaIpcGetMemHandle/OpenMemHandle,
    # with kernels on both sides; return codes as native.
    bin=$build/examples/ipc_share; need "$bin"
    probe_pair "$bin"
    grep -E 'IPC listener|exit report' <<<"$shimmed" | sed 's/^/shim   /'
    grep -q 'ipc_share: OK' <<<"$shimmed" || fail "shim run did not verify"
    grep -qE 'exit report: served [1-9][0-9]* allocations.* [1-9][0-9]* IPC exports' <<<"$shimmed" ||
      fail "the exporter's memory was not served from VMM and exported"
    off=$(LD_PRELOAD=$shim VMMSHIM_IPC=0 "$bin" 2>&1); echo "VMMSHIM_IPC=0: $(grep -m1 cudaIpc <<<"$off")"
    ;;
  lifecycle)
    bin=$build/examples/lifecycle_probe; need "$bin"
    probe_pair "$bin"
    grep -E 'released|exit report' <<<"$shimmed" | sed 's/^/shim   /'
    grep -q 'back to its starting value.*: yes' <<<"$shimmed" || fail "memory not back after reset"
    ;;
  compression)
    bin=$build/examples/lifecycle_probe; need "$bin"
    out=$(LD_PRELOAD=$shim VMMSHIM_LOG_LEVEL=info VMMSHIM_COMPRESSION=generic "$bin" 2>&1) || fail "$out"
    grep -E 'compression|exit report' <<<"$out"
    grep -q 'lifecycle_probe: OK' <<<"$out" || fail "the program failed with compression"
    grep -qE 'compression granted|not granted|does not support' <<<"$out" || fail "no compression outcome logged"
    ;;
  stream_ordered)
    # cudaMallocAsync served from VMM: the driver-behaviour probe gives the
    # same PARITY lines, the streamOrderedAllocation-style sample the same
    # results (docs/stream-ordered.md).
    bin=$build/examples/stream_ordered_probe; need "$bin"
    log=$(mktemp)  # the shim's log apart: at exit it could land inside a stdout line
    native=$("$bin" 2>&1) || fail "native probe: $native"
    shimmed=$(under_shim "$bin" 2>"$log") || fail "shim probe: $shimmed $(cat "$log")"
    diff <(grep ^PARITY <<<"$native") <(grep ^PARITY <<<"$shimmed") ||
      fail "PARITY lines differ (left: native, right: shim)"
    echo "probe: $(grep -c ^PARITY <<<"$native") PARITY lines identical"
    grep ^INFO <<<"$native" | sed 's/^/native /'; grep ^INFO <<<"$shimmed" | sed 's/^/shim   /'
    grep 'exit report' "$log"
    # Undefined natively: what each does is recorded, not compared.
    for mode in native shim; do
      if [ $mode = native ]; then o=$("$bin" destroyed-stream 2>&1); else o=$(under_shim "$bin" destroyed-stream 2>&1); fi
      echo "free on a destroyed stream, $mode: exit status $?: $(grep -v '^\[vmmshim' <<<"$o" | tr '\n' ' ')"
    done
    bin=$build/examples/stream_ordered_sample; need "$bin"
    native=$("$bin" 2>&1) || fail "native sample: $native"
    shimmed=$(under_shim "$bin" 2>&1) || fail "shim sample: $shimmed"
    echo "$native" | sed 's/^/native /'; echo "$shimmed" | grep -v '^\[vmmshim' | sed 's/^/shim   /'
    diff <(grep ^RESULT <<<"$native") <(grep ^RESULT <<<"$shimmed") || fail "results differ"
    grep 'exit report' <<<"$shimmed"
    grep -qE 'stream-ordered: [1-9][0-9]* allocations served' <<<"$shimmed" ||
      fail "cudaMallocAsync not served from VMM"
    ;;
  torch_async)
    # PyTorch's cudaMallocAsync backend: identical weights, served from VMM.
    have_torch
    export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
    native=$(python3 "$src/examples/train_mlp.py" --steps 100 2>&1) || fail "native: $native"
    shimmed=$(under_shim python3 "$src/examples/train_mlp.py" --steps 100 2>&1) || fail "shim: $shimmed"
    echo "native: $(grep train_mlp: <<<"$native")"; echo "shim:   $(grep train_mlp: <<<"$shimmed")"
    grep 'exit report' <<<"$shimmed"
    [ "$(grep train_mlp: <<<"$native")" = "$(grep train_mlp: <<<"$shimmed")" ] || fail "weights differ"
    grep -qE 'stream-ordered: [1-9][0-9]* allocations served' <<<"$shimmed" ||
      fail "PyTorch's cudaMallocAsync not served from VMM"
    python3 -c 'import torch; print("backend", torch.cuda.get_allocator_backend())'
    ;;
  cupy_async)
    python3 -c "import cupy" 2>/dev/null || { echo "SKIP: CuPy is not installed"; exit 77; }
    native=$(python3 "$src/examples/cupy_async.py" 2>&1) || fail "native: $native"
    shimmed=$(under_shim python3 "$src/examples/cupy_async.py" 2>&1) || fail "shim: $shimmed"
    echo "$native" | sed 's/^/native /'; echo "$shimmed" | grep -E 'cupy_async|exit report' | sed 's/^/shim   /'
    [ "$(grep -o 'checksum [0-9]*' <<<"$native")" = "$(grep -o 'checksum [0-9]*' <<<"$shimmed")" ] ||
      fail "checksums differ"
    grep -qE 'stream-ordered: [1-9][0-9]* allocations served' <<<"$shimmed" ||
      fail "CuPy's MemoryAsyncPool not served from VMM"
    ;;
  sleep_wake)
    # Pause and resume on five allocators (examples/sleep_wake.py): weights
    # kept, everything else dropped (JAX: everything kept), another phase in
    # the freed memory, then the same result as a native run that never
    # paused; the shim's stream-ordered memory, and under expandable
    # segments PyTorch's own VMM memory, must have been paused.
    have_torch
    export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
    for fw in torch torch-async torch-expandable cupy-async jax-async; do
      case $fw in
        cupy-async) python3 -c "import cupy" 2>/dev/null || { echo "$fw: CuPy is not installed"; continue; } ;;
        jax-async) python3 -c "import jax" 2>/dev/null || { echo "$fw: JAX is not installed"; continue; } ;;
      esac
      args=(--framework "$fw" --kv-gib 2 --work-gib 2)
      native=$(python3 "$src/examples/sleep_wake.py" "${args[@]}" --no-pause 2>&1) || fail "$fw native: $native"
      shimmed=$(under_shim python3 "$src/examples/sleep_wake.py" "${args[@]}" 2>&1) || fail "$fw shim: $shimmed"
      echo "native: $(grep ^result <<<"$native")"; echo "shim:   $(grep ^result <<<"$shimmed")"
      grep -E 'sleep_wake: .*(paused|resumed)|vmmshim_(pause|resume)_memory\(' <<<"$shimmed"
      # Exit 0 means the result after the resume equals the one before; JAX's
      # results differ between processes even natively (autotuning).
      [ "$fw" = jax-async ] || [ "$(grep ^result <<<"$native")" = "$(grep ^result <<<"$shimmed")" ] ||
        fail "$fw: results differ from the native run"
      grep -qE 'sleep_wake: .*paused [1-9][0-9]* bytes' <<<"$shimmed" || fail "$fw: nothing paused"
      if [ "$fw" = torch-expandable ]; then
        grep -qE '"paused_by_tag":\{[^}]*"kv":[1-9]' <<<"$shimmed" ||
          fail "$fw: PyTorch's own VMM memory under kv not paused"
      fi
    done
    ;;
  sleep_whole_process)
    # Everything a PyTorch process holds (weights kept, a KV cache dropped,
    # a captured graph's pool, cuBLAS's workspace, a one-rank NCCL group)
    # paused and resumed (examples/sleep_whole_process.py): results equal
    # to a native run that never paused.
    have_torch
    export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
    args=(--kv-gib 2 --work-gib 2)
    native=$(python3 "$src/examples/sleep_whole_process.py" --backend none "${args[@]}" 2>&1) ||
      fail "native: $native"
    shimmed=$(under_shim python3 "$src/examples/sleep_whole_process.py" --backend vmmshim "${args[@]}" 2>&1) ||
      fail "shim: $shimmed"
    grep -E '^result|sleep_whole_process:' <<<"$native" | sed 's/^/native: /'
    grep -E '^result|sleep_whole_process: .*(paused|resumed|allocated|started)' <<<"$shimmed" | sed 's/^/shim: /'
    [ "$(grep ^result <<<"$native")" = "$(grep ^result <<<"$shimmed")" ] ||
      fail "results differ from the native run"
    grep -qE '"paused_by_tag":\{"[^}]*":[1-9]' <<<"$shimmed" ||
      fail "no other library's VMM memory (NCCL's) paused"
    ;;
  tms_suite)
    # torch_memory_saver's own test suite (../shared/peers/torch_memory_saver:
    # its test/ at 4a43c97, unchanged) through the drop-in, as the suite's
    # README runs it: every test must pass or skip (on one GPU: the
    # multi-device and XPU ones skip, with the suite's own reasons).
    have_torch
    python3 -c "import pytest" 2>/dev/null || { echo "SKIP: pytest is not installed"; exit 77; }
    suite=""
    for d in "${VMMSHIM_TMS_SUITE:-}" "$src/../shared/peers/torch_memory_saver" \
             "$src/.gpu/peers/torch_memory_saver"; do
      if [ -n "$d" ] && [ -d "$d/test" ]; then suite=$d; break; fi
    done
    [ -n "$suite" ] || { echo "SKIP: torch_memory_saver's test suite is not here" \
      "(../shared/peers/torch_memory_saver, .gpu/peers/torch_memory_saver or VMMSHIM_TMS_SUITE)"; exit 77; }
    out=$(cd "$suite" && "$build/vmmshim" run --torch-memory-saver -- python3 -m pytest -q -rA \
          -p no:cacheprovider test --continue-on-collection-errors \
          --ignore=test/test_merge_cuda_wheels.py 2>&1)
    rc=$?
    grep -E '^(PASSED|FAILED|SKIPPED|ERROR) |[0-9]+ (passed|failed)' <<<"$out"
    [ $rc = 0 ] || { tail -80 <<<"$out"; fail "torch_memory_saver's suite through the drop-in (exit $rc)"; }
    ;;
  memory_snapshot)
    # Snapshots (docs/memory-snapshots.md) of a PyTorch program and of a
    # static-cudart one, read by PyTorch's own torch.cuda._memory_viz (its
    # segment summary asserts that blocks tile their segments); the callers
    # named: libc10_cuda (through the shared libcudart) and the program.
    have_torch
    dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
    native=$(python3 "$src/examples/train_mlp.py" --steps 50 2>&1) || fail "native: $native"
    shimmed=$(VMMSHIM_SNAPSHOT_FILE=$dir/torch.pickle under_shim python3 \
              "$src/examples/train_mlp.py" --steps 50 2>&1) || fail "shim: $shimmed"
    [ "$(grep train_mlp: <<<"$native")" = "$(grep train_mlp: <<<"$shimmed")" ] ||
      fail "checksums differ: $native / $shimmed"
    bin=$build/examples/alloc_mix; need "$bin"
    out=$(VMMSHIM_SNAPSHOT_FILE=$dir/static.pickle LD_PRELOAD=$shim "$bin" 1 2>&1) || fail "$out"
    for snap in torch static; do
      stats=$(python3 -m torch.cuda._memory_viz stats "$dir/$snap.pickle" 2>&1) ||
        fail "_memory_viz stats of $snap: $stats"
      python3 -m torch.cuda._memory_viz trace "$dir/$snap.pickle" > "$dir/$snap.trace" 2>&1 ||
        fail "_memory_viz trace of $snap: $(tail -3 "$dir/$snap.trace")"
      python3 -m torch.cuda._memory_viz trace_plot "$dir/$snap.pickle" -o "$dir/$snap.html" 2>&1 ||
        fail "_memory_viz trace_plot of $snap"
      echo "$snap: $(grep -E '^(segments|total_allocated)' <<<"$stats" | tr '\n' ' ')"
    done
    libraries() {
      python3 -c 'import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
print(" ".join(sorted({e["library"] for t in d["device_traces"] for e in t if e["action"] == "alloc"})))' "$1"
    }
    torch_libs=$(libraries "$dir/torch.pickle"); static_libs=$(libraries "$dir/static.pickle")
    echo "callers: PyTorch program: $torch_libs; static-cudart program: $static_libs"
    grep -qw libc10_cuda <<<"$torch_libs" || fail "libc10_cuda not named"
    [ "$static_libs" = alloc_mix ] || fail "the static-cudart program's allocations: $static_libs"
    ;;
  safe_pause)
    # Ordinary work while paused (examples/safe_pause.py): one tag,
    # everything, everything but one tag, with and without contents, under
    # PyTorch's three allocator modes and CuPy's default pool; allocations,
    # cuBLAS, a CUDA graph, a one-rank NCCL all-reduce and a phase larger than
    # the memory free before the pause, with results equal to a run that never
    # paused.
    have_torch
    export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
    args=(--kv-gib 2 --untagged-gib 1)
    for mode in default expandable_segments:True backend:cudaMallocAsync cupy; do
      fw=torch conf=$mode
      [ "$mode" = default ] && conf=""
      if [ "$mode" = cupy ]; then
        python3 -c "import cupy" 2>/dev/null || { echo "cupy: CuPy is not installed"; continue; }
        fw=cupy conf=""
      fi
      ref=$(PYTORCH_CUDA_ALLOC_CONF=$conf python3 "$src/examples/safe_pause.py" --framework $fw \
            --no-pause "${args[@]}" 2>&1) || fail "$mode reference: $ref"
      got=$(PYTORCH_CUDA_ALLOC_CONF=$conf under_shim python3 "$src/examples/safe_pause.py" \
            --framework $fw "${args[@]}" 2>&1) || fail "$mode under the shim: $(tail -30 <<<"$got")"
      grep -E '^(result|measure)' <<<"$got" | sed "s/^/$mode: /"
      [ "$(grep ^result <<<"$ref")" = "$(grep ^result <<<"$got")" ] ||
        fail "$mode: results differ from the never-paused run: $(diff <(grep ^result <<<"$ref") <(grep ^result <<<"$got"))"
    done
    ;;
  tms_drop_in)
    # A program written for torch_memory_saver (examples/tms_sleep_wake.py:
    # regions with and without a CPU backup, a CUDA graph, get_cpu_backup)
    # through vmmshim's drop-in (vmmshim run --torch-memory-saver): the same
    # result as the same program never paused, the backup holds the weight.
    have_torch
    args=(--kv-gib 2 --cycles 3)
    ref=$("$build/vmmshim" run --torch-memory-saver -- python3 "$src/examples/tms_sleep_wake.py" \
          --no-pause "${args[@]}" 2>&1) || fail "never paused: $ref"
    out=$("$build/vmmshim" run --torch-memory-saver --log-level info -- \
          python3 "$src/examples/tms_sleep_wake.py" "${args[@]}" 2>&1) || fail "paused: $out"
    echo "never paused: $(grep result <<<"$ref")"
    grep -E '^tms_sleep_wake:' <<<"$out" | sed 's/^/paused:       /'
    [ "$(grep result <<<"$ref")" = "$(grep result <<<"$out")" ] || fail "results differ"
    grep -q 'cpu backup of a weight while paused: identical' <<<"$out" || fail "the CPU backup"
    [ "$(served "$out")" -ge 1 ] || fail "nothing served by the shim"
    ;;
  cupy_pool)
    # CuPy's MemoryAsyncPool figures (reserved, used, free) behave as the
    # driver's through small and large allocations and frees
    # (examples/cupy_pool_figures.py: its PARITY lines).
    python3 -c "import cupy" 2>/dev/null || { echo "SKIP: CuPy is not installed"; exit 77; }
    native=$(python3 "$src/examples/cupy_pool_figures.py" 2>&1) || fail "native: $native"
    shimmed=$(LD_PRELOAD=$shim python3 "$src/examples/cupy_pool_figures.py" 2>&1) || fail "shim: $shimmed"
    sed 's/^/native: /' <<<"$native"; sed 's/^/shim:   /' <<<"$shimmed"
    [ "$(grep ^PARITY <<<"$native")" = "$(grep ^PARITY <<<"$shimmed")" ] ||
      fail "the pool's figures behave differently"
    ;;
  residency)
    # The residency report on a PyTorch process: the tagged memory is the
    # shim's under the caching allocator and other libraries' VMM memory
    # (observed, by tag) under expandable_segments:True.
    have_torch
    export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
    for conf in "" "expandable_segments:True"; do
      got=$(PYTORCH_CUDA_ALLOC_CONF=$conf LD_PRELOAD=$shim python3 "$src/examples/residency_report.py" --gib 2 2>&1) ||
        fail "PYTORCH_CUDA_ALLOC_CONF=$conf: $got"
      grep -v '^\[vmmshim' <<<"$got"
    done
    ;;
  rmm_async)
    # RMM's stream-ordered resources (wheels from tools/gpu/fetch-wheels.sh,
    # installed into a temporary directory when RMM is not installed).
    python3 -c "import cupy" 2>/dev/null || { echo "SKIP: CuPy is not installed"; exit 77; }
    if ! python3 -c "import rmm" 2>/dev/null; then
      ls "$src"/.gpu/wheels/rmm*.whl >/dev/null 2>&1 ||
        { echo "SKIP: RMM is not installed and no wheels in .gpu/wheels (tools/gpu/fetch-wheels.sh)"; exit 77; }
      site=$(mktemp -d)
      pip install --quiet --no-index --no-deps --target "$site" "$src"/.gpu/wheels/*.whl ||
        fail "installing the RMM wheels"
      export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    fi
    for resource in view async; do
      native=$(python3 "$src/examples/rmm_async.py" --resource $resource 2>&1) ||
        fail "native ($resource): $native"
      shimmed=$(under_shim python3 "$src/examples/rmm_async.py" --resource $resource 2>&1) ||
        fail "shim ($resource): $shimmed"
      echo "native: $(grep rmm_async <<<"$native")"; echo "shim:   $(grep rmm_async <<<"$shimmed")"
      grep 'exit report' <<<"$shimmed"
      [ "$(grep -o 'checksum [0-9]*' <<<"$native")" = "$(grep -o 'checksum [0-9]*' <<<"$shimmed")" ] ||
        fail "checksums differ ($resource)"
      [ $resource = view ] && view=$shimmed
    done
    # The view on the default pool is served; the resource's own pool is not.
    grep -qE 'stream-ordered: [1-9][0-9]* allocations served' <<<"$view" ||
      fail "RMM's view resource not served"
    ;;
  torch_ipc)
    have_torch
    native=$(python3 "$src/examples/torch_ipc.py" 2>&1) || fail "native: $native"
    shimmed=$(under_shim python3 "$src/examples/torch_ipc.py" 2>&1) || fail "shim: $shimmed"
    echo "native: $(grep torch_ipc: <<<"$native")"; echo "shim:   $(grep torch_ipc: <<<"$shimmed")"
    grep -E 'IPC listener|exit report' <<<"$shimmed"
    [ "$(grep torch_ipc: <<<"$native")" = "$(grep torch_ipc: <<<"$shimmed")" ] || fail "results differ"
    grep -q 'torch_ipc:.*OK' <<<"$shimmed" || fail "not OK under the shim"
    ;;
  peer_example)
    bin=$build/examples/peer_access; need "$bin"
    native=$("$bin" 2>&1) || fail "native: $native"
    shimmed=$(LD_PRELOAD=$shim VMMSHIM_PEER_POLICY=min-size VMMSHIM_PEER_MIN_BYTES=1M "$bin" 2>&1) ||
      fail "shim: $shimmed"
    echo "native: $native"; echo "shim:   $shimmed"
    ;;
  batched_set_access)
    bin=$build/tests/gpu/set_access_probe; need "$bin"
    "$bin" || fail "the driver refused one cuMemSetAccess over adjacent mappings"
    ;;
  pinned_pool)
    # Pauses with contents into the pinned pool (VMMSHIM_PINNED_POOL, which
    # serves VMMSHIM_PAUSED_ACCESS=fault and the deep sleep) and without it,
    # bench/pause_bandwidth.py at 2 GiB: one tensor, and a
    # trainer's mixed set under expandable segments (PyTorch's own VMM
    # memory); every tensor intact after every cycle. Speeds are shown, not
    # judged (the benchmark judges them: docs/pause-resume-design.md).
    have_torch
    out=$(PYTHONPATH=$src/python python3 "$src/bench/pause_bandwidth.py" --shim "$shim" \
          --rounds 1 --cycles 2 --gib 2 --pool-gib 3 --workloads tensor,mixed-expandable \
          --configs fault-pool,fault 2>&1) ||
      fail "$out"
    echo "$out"
    [ "$(grep -c 'intact$' <<<"$out")" = 4 ] || fail "not every run intact"
    ;;
  deep_sleep)
    # `vmmshim sleep PID` / `vmmshim wake PID` of a PyTorch process holding
    # weights and a 2 GiB KV cache (examples/deep_sleep_workload.py), with
    # everything kept, with the KV cache dropped, and with a pinned pool: 0
    # MiB on nvidia-smi while asleep, the same result after the wake. The
    # pool (6 GiB, about 4.2 GiB kept) gives its pinning back for the
    # driver's checkpoint and the wake's copies take back only the chunks
    # they use: after the wake, some of it is pinned and not all.
    have_torch
    export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
    for how in keep drop pool; do
      pool=0; drop=(); [ $how = drop ] && drop=(--drop kv); [ $how = pool ] && pool=6G
      coproc W { LD_PRELOAD=$shim VMMSHIM_PINNED_POOL=$pool exec python3 \
                   "$src/examples/deep_sleep_workload.py" --kv-gib 2; }
      read -r -t 120 line <&"${W[0]}" || fail "$how: the workload did not start"
      pid=${line#ready }
      echo result >&"${W[1]}"; read -r -t 60 before <&"${W[0]}"
      slept=$("$build/vmmshim" sleep "$pid" "${drop[@]}" 2>&1) || fail "$how: $slept"
      asleep=$(held "$pid")
      woke=$("$build/vmmshim" wake "$pid" 2>&1) || fail "$how: $woke"
      if [ $how = drop ]; then echo refill >&"${W[1]}"; read -r -t 60 _ <&"${W[0]}"; fi
      echo result >&"${W[1]}"; read -r -t 60 after <&"${W[0]}"
      pinned=$("$build/vmmshim" ps --json | python3 -c "import json, sys
p = [e for e in json.load(sys.stdin) if e['pid'] == $pid][0]['residency']['pinned_pool']
print(p['pinned_bytes'], p['bytes'])")
      echo quit >&"${W[1]}"; wait "$W_PID"
      echo "$how: $slept; $asleep MiB asleep; $woke; pinned pool after the wake (pinned, made): $pinned"
      echo "  before: $before"; echo "  after:  $after"
      [ "$asleep" = 0 ] || fail "$how: $asleep MiB held while asleep"
      [ -n "$before" ] && [ "$before" = "$after" ] || fail "$how: the result changed"
      if [ $how = pool ]; then
        read -r pinned_now made <<<"$pinned"
        [ "$made" -gt 0 ] && [ "$pinned_now" -gt 0 ] && [ "$pinned_now" -lt "$made" ] ||
          fail "pool: after the wake $pinned_now of $made bytes pinned (want some, not all)"
      fi
    done
    ;;
  busy_sleep)
    # A process put to sleep while it works: examples/busy_workload.py
    # (bf16 matmuls on one thread, host <-> device copies on a side stream
    # on another, a fixed number of steps) slept with `vmmshim sleep PID`
    # and woken with `vmmshim wake PID` 3 times at random moments, under each
    # of PyTorch's allocator modes: every sleep and wake succeeds, 0 MiB on
    # nvidia-smi while asleep, and the result equals a run under the shim
    # that nobody slept (tools/gpu/busy-sleep.sh does more cycles).
    have_torch
    export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
    app=(python3 "$src/examples/busy_workload.py" --steps 2500 --timeout 400)
    dir=$(mktemp -d); pid=""
    trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
    for conf in "" expandable_segments:True backend:cudaMallocAsync; do
      m=${conf:-default}
      timeout -k 10 450 env LD_PRELOAD="$shim" PYTORCH_CUDA_ALLOC_CONF="$conf" "${app[@]}" \
        >"$dir/ref" 2>"$dir/ref.err" || fail "$m: the run nobody slept: $(tail -20 "$dir/ref.err")"
      want=$(grep '^result ' "$dir/ref")
      [[ $want == *" mismatches 0" ]] || fail "$m: the run nobody slept: ${want:-no result}"
      rm -f "$dir/out" "$dir/err"  # no earlier mode's "ready" seen before the new file is made
      env LD_PRELOAD="$shim" PYTORCH_CUDA_ALLOC_CONF="$conf" "${app[@]}" >"$dir/out" 2>"$dir/err" &
      pid=$!
      for ((t = 0; t < 600; t++)); do
        grep -q '^ready ' "$dir/out" 2>/dev/null && break
        alive "$pid" || fail "$m: the workload ended before it was ready: $(tail -20 "$dir/err")"
        sleep 0.2
      done
      grep -q '^ready ' "$dir/out" || fail "$m: the workload was not ready after 120 s"
      for i in 1 2 3; do
        sleep "0.$((3 + RANDOM % 7))"
        alive "$pid" || fail "$m: the workload ended before cycle $i (it needs more --steps)"
        slept=$(timeout 120 "$build/vmmshim" sleep "$pid" 2>&1) || fail "$m cycle $i: sleep: $slept"
        asleep=$(held "$pid")
        woke=$(timeout 120 "$build/vmmshim" wake "$pid" 2>&1) || fail "$m cycle $i: wake: $woke"
        echo "$m cycle $i: $slept; $asleep MiB asleep; $woke"
        [ "$asleep" = 0 ] || fail "$m cycle $i: $asleep MiB held while asleep"
      done
      for ((t = 0; t < 900; t++)); do alive "$pid" || break; sleep 0.5; done
      alive "$pid" && fail "$m: the slept workload did not end"
      wait "$pid"; rc=$?; pid=""
      got=$(grep '^result ' "$dir/out")
      echo "$m: nobody slept: $want"; echo "$m: slept 3 times: ${got:-no result} (exit $rc)"
      [ $rc = 0 ] || fail "$m: the slept workload exited with $rc: $(tail -20 "$dir/err")"
      [ "$got" = "$want" ] || fail "$m: the result differs from the run nobody slept"
    done
    ;;
  paused_access)
    # Paused memory stays addressable (examples/paused_access.py): kernels,
    # a CUDA graph and an optimizer step on paused tensors, kept and
    # dropped, with 0 faults and every kept tensor equal to a never-paused
    # run's, under PyTorch's three allocator modes (expandable segments: other
    # libraries' VMM memory to the shim, mapped whole per page); then the
    # host memory kept for the next pause: a second cycle of
    # bench/pause_bandwidth.py copies without making any.
    have_torch
    export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
    for conf in "" backend:cudaMallocAsync expandable_segments:True; do
      out=$(LD_PRELOAD="$shim" PYTORCH_CUDA_ALLOC_CONF="$conf" VMMSHIM_PAUSED_ACCESS=host \
            VMMSHIM_HOST_POOL_MAKE=pause \
            python3 "$src/examples/paused_access.py" --gib 2 2>&1) || fail "${conf:-default}: $out"
      echo "${conf:-default}:"; grep '^paused-access' <<<"$out" | sed 's/^/  /'
      grep -q '^paused-access: identical' <<<"$out" || fail "${conf:-default}: not identical"
    done
    # Under the defaults (host memory made in the background): the first
    # pause's kept contents fault until that memory is there and they have
    # moved into it (Note [Views made late], core/heap/pause.h); the program
    # waits for residency()'s paused_faulting_bytes to reach 0, then touches.
    for conf in "" expandable_segments:True; do
      out=$(LD_PRELOAD="$shim" PYTORCH_CUDA_ALLOC_CONF="$conf" VMMSHIM_LOG_LEVEL=info \
            python3 "$src/examples/paused_access.py" --gib 2 --await-addressable 120 2>&1) ||
        fail "${conf:-default}, made in the background: $out"
      echo "${conf:-default}, made in the background:"
      grep -E '^paused-access|moved into the host memory' <<<"$out" | sed 's/^/  /'
      grep -q '^paused-access: identical' <<<"$out" ||
        fail "${conf:-default}, made in the background: not identical"
    done
    out=$(python3 "$src/bench/pause_bandwidth.py" --shim "$shim" --rounds 1 --cycles 2 --gib 2 \
          --workloads mixed --configs host,default 2>&1) || fail "$out"
    echo "$out"
    [ "$(grep -c 'intact$' <<<"$out")" = 2 ] || fail "not intact"
    # A deep sleep after such pauses: the host memory they left goes before
    # the driver's checkpoint (its restore fails otherwise), a pause of the
    # program's own is refused (tests/gpu/sleep_after_paused_access.py).
    for mode in kept dropped none; do
      out=$(LD_PRELOAD="$shim" VMMSHIM_PAUSED_ACCESS=host VMMSHIM_HOST_POOL_MAKE=pause timeout 120 \
            python3 "$src/tests/gpu/sleep_after_paused_access.py" $mode 2>&1) || fail "$mode: $out"
      grep '^sleep-after-paused-access' <<<"$out"
    done
    ;;
  busy_pause)
    # The same workload pausing everything from a thread of its own while
    # its two other threads launch work (--pause-thread 5: vmmshim.pause(),
    # held 0.05-0.3 s, vmmshim.resume()), under each of PyTorch's allocator
    # modes: every pause comes while the work runs, and the result equals a
    # run that never paused.
    have_torch
    export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
    app=(python3 "$src/examples/busy_workload.py" --steps 3000 --timeout 400)
    dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
    for conf in "" expandable_segments:True backend:cudaMallocAsync; do
      m=${conf:-default}
      timeout -k 10 450 env LD_PRELOAD="$shim" PYTORCH_CUDA_ALLOC_CONF="$conf" "${app[@]}" \
        >"$dir/ref" 2>"$dir/ref.err" || fail "$m: the run that never paused: $(tail -20 "$dir/ref.err")"
      want=$(grep '^result ' "$dir/ref")
      [[ $want == *" mismatches 0" ]] || fail "$m: the run that never paused: ${want:-no result}"
      timeout -k 10 450 env LD_PRELOAD="$shim" PYTORCH_CUDA_ALLOC_CONF="$conf" "${app[@]}" \
        --pause-thread 5 --pause-seed "$RANDOM" >"$dir/out" 2>"$dir/err"
      rc=$?
      got=$(grep '^result ' "$dir/out")
      grep -E '^pause cycle' "$dir/out" | sed "s/^/$m: /"
      echo "$m: never paused: $want"; echo "$m: paused 5 times: ${got:-no result} (exit $rc)"
      [ $rc = 0 ] || fail "$m: the paused workload exited with $rc: $(tail -30 "$dir/err")"
      [ "$got" = "$want" ] || fail "$m: the result differs from the run that never paused"
      grep -qx 'pause cycles 5, 5 during the work' "$dir/out" ||
        fail "$m: not every pause came while the work ran ($(grep '^pause cycles' "$dir/out"));" \
             "the workload needs more --steps"
    done
    ;;
  *) fail "unknown check $check" ;;
esac
echo "PASS: $check"

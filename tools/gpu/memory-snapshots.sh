#!/usr/bin/env bash
# Memory snapshots on a GPU host (docs/memory-snapshots.md): a PyTorch program, a CuPy
# program and a static-cudart program write snapshots under the shim, and PyTorch's own
# torch.cuda._memory_viz reads each (stats, trace, trace_plot and segment_plot HTML, and
# the memory flamegraph when flamegraph.pl is in .gpu/); a program that runs out of
# memory prints the shim's report; then the cost per allocation of attribution, the
# history and call stacks (bench/observability_bench.sh). Results under $OUT.
# usage: tools/gpu/memory-snapshots.sh [ROUNDS]   (from the repository root of a bundle)
set -uo pipefail
rounds=${1:-3}
source tools/gpu/host-env.sh
# Where torch.cuda._memory_viz looks for flamegraph.pl before downloading it (the place
# changed between PyTorch versions; a GPU host has no network).
if [ -f .gpu/flamegraph.pl ]; then
  install -D -m 755 .gpu/flamegraph.pl "/tmp/$(id -u)_flamegraph.pl"
  install -D -m 755 .gpu/flamegraph.pl "$HOME/.cache/flamegraph.pl"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

viz() {  # NAME: renders $out/NAME.pickle with PyTorch's _memory_viz
  local name=$1 snap=$out/$1.pickle
  echo "== $name: $(stat -c %s "$snap") bytes"
  python3 -m torch.cuda._memory_viz stats "$snap" > "$out/$name.stats.txt" 2>&1 || echo "stats FAILED"
  python3 -m torch.cuda._memory_viz trace "$snap" 2>&1 | head -c 200000 > "$out/$name.trace.txt"
  python3 -m torch.cuda._memory_viz trace_plot "$snap" -o "$out/$name.html" || echo "trace_plot FAILED"
  python3 -m torch.cuda._memory_viz segment_plot "$snap" -o "$out/$name.segments.html" ||
    echo "segment_plot FAILED"
  if [ -f "/tmp/$(id -u)_flamegraph.pl" ]; then
    python3 -m torch.cuda._memory_viz memory "$snap" -o "$out/$name.memory.svg" || echo "memory FAILED"
  fi
  tail -4 "$out/$name.stats.txt"
  python3 - "$snap" <<'PY'
import collections, pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
by_lib, count = collections.Counter(), collections.Counter()
for t in d["device_traces"]:
    for e in t:
        if e["action"] == "alloc":
            by_lib[e.get("library", "?")] += e["size"]
            count[e.get("library", "?")] += 1
print("allocations by caller library (history):")
for lib, n in by_lib.most_common():
    print(f"  {lib:<40} {count[lib]:>7} allocations {n / 2**20:12.1f} MiB")
acts = collections.Counter(e["action"] for t in d["device_traces"] for e in t)
print("events:", dict(acts), "segments:", len(d["segments"]),
      "dropped:", d["vmmshim"]["dropped_events"])
PY
}

echo "== train_mlp (PyTorch)"
python3 examples/train_mlp.py > "$out/train_mlp.native.txt" 2>&1
VMMSHIM_SNAPSHOT_FILE=$out/train_mlp.pickle LD_PRELOAD=$shim python3 examples/train_mlp.py \
  > "$out/train_mlp.shim.txt" 2>&1
tail -1 "$out/train_mlp.native.txt" "$out/train_mlp.shim.txt"
viz train_mlp

echo "== ($SECONDS s) cupy_libraries (CuPy, cuBLAS, cuFFT)"
python3 examples/cupy_libraries.py > "$out/cupy.native.txt" 2>&1
VMMSHIM_SNAPSHOT_FILE=$out/cupy_libraries.pickle LD_PRELOAD=$shim python3 \
  examples/cupy_libraries.py > "$out/cupy.shim.txt" 2>&1
tail -1 "$out/cupy.native.txt" "$out/cupy.shim.txt"
viz cupy_libraries

echo "== ($SECONDS s) alloc_mix (static cudart)"
"$b/examples/alloc_mix" 2 > "$out/alloc_mix.native.txt" 2>&1
VMMSHIM_SNAPSHOT_FILE=$out/alloc_mix.pickle LD_PRELOAD=$shim "$b/examples/alloc_mix" 2 \
  > "$out/alloc_mix.shim.txt" 2>&1
tail -1 "$out/alloc_mix.native.txt" "$out/alloc_mix.shim.txt"
viz alloc_mix

echo "== ($SECONDS s) oom_report (PyTorch, out of memory on purpose)"
PYTHONPATH=$root/python VMMSHIM_SNAPSHOT_FILE=$out/oom.pickle LD_PRELOAD=$shim \
  python3 examples/oom_report.py > "$out/oom.txt" 2>&1
echo "exit status $?"
cat "$out/oom.txt"
[ -f "$out/oom.oom.pickle" ] && cp "$out/oom.oom.pickle" "$out/oom_at_failure.pickle" &&
  viz oom_at_failure

echo "== cost per allocation ($SECONDS s so far)"
# Two CPUs for the benchmark and its driver threads: less noise from migrations.
timeout 300 taskset -c 2,3 bench/observability_bench.sh --rounds "$rounds" "$shim" "$out/observability" \
  "$b/bench/alloc_bench" "$b/bench/alloc_bench_shared_cudart" > /dev/null 2>&1 ||
  echo "observability_bench: exit status $?"
cat "$out/observability/report.txt"
rm -f "$out"/observability/snapshot.pickle
echo "== done in $SECONDS s"
# At most 8 files come back from a GPU host: everything in one archive.
tar -C "$out" -czf /tmp/memory-snapshots.tar.gz . &&
  find "$out" -mindepth 1 -delete && mv /tmp/memory-snapshots.tar.gz "$out/"

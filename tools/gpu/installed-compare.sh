#!/usr/bin/env bash
# The installed `vmmshim` on a GPU host (after tools/gpu/bundle.sh and
# tools/gpu/fetch-wheels.sh): the gpu-labelled checks; the build tree installed into a staging prefix as a
# user would (`cmake --install`), its vmmshim --version and the exit report's
# version; then the installed `vmmshim compare` on real programs: PyTorch
# training (examples/train_mlp.py through python3) under all and none, and a
# static-cudart program (examples/alloc_mix) under all, none, min-size:1M.
# Tables and files in $OUT/compare-*.
# usage: tools/gpu/installed-compare.sh [REPEAT]   (GPU_CTEST=0 skips the checks)
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
repeat=${1:-3}
gpu_header_and_checks
echo "== cmake --install into a staging prefix"
inst=$(mktemp -d)/usr
cmake --install "$b" --prefix "$inst" > "$out/install.txt" 2>&1 || { tail "$out/install.txt"; exit 1; }
"$inst/bin/vmmshim" --version
ls "$inst/lib/libvmmshim.so" "$inst/share/vmmshim/compare_chart.py"
echo "== exit report and statistics file of a static-cudart program under the installed shim"
"$inst/bin/vmmshim" run --log-level info --stats "$out/alloc_mix-stats.json" -- \
  "$b/examples/alloc_mix" 1 2>&1 | grep -E "exit report|PASSED|FAILED"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('statistics file version', d['version'], 'peer_enable_calls', d['totals']['peer_enable_calls'])" "$out/alloc_mix-stats.json"
python3 -c "import matplotlib; print('matplotlib', matplotlib.__version__)" 2>&1 | tail -1
echo "== vmmshim compare: PyTorch training (examples/train_mlp.py), policies all and none"
"$inst/bin/vmmshim" compare --policies all,none --repeat "$repeat" --out "$out/compare-train-mlp" \
  -- python3 "$root/examples/train_mlp.py" --steps 200 2>"$out/compare-train-mlp.progress"
echo "compare exit status $?"
echo "== vmmshim compare: static-cudart examples/alloc_mix 1, policies all, none, min-size:1M"
"$inst/bin/vmmshim" compare --policies all,none,min-size:1M --repeat "$repeat" \
  --out "$out/compare-alloc-mix" -- "$b/examples/alloc_mix" 1 2>"$out/compare-alloc-mix.progress"
echo "compare exit status $?"
# Each run's files in one archive per comparison (few files come back).
for d in "$out"/compare-*/; do
  tar -C "$d" -czf "${d%/}/runs.tgz" runs && rm -rf "${d%/}/runs"
done

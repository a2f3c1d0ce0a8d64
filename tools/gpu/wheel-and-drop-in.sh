#!/usr/bin/env bash
# The wheel on a GPU host, as a Python user gets it, in one call:
#   1. installed with pip into a fresh virtual environment (the host's PyTorch
#      made visible after its own packages), offline (--no-index);
#   2. `vmmshim run -- python3 examples/train_mlp.py` against a native run
#      (the weights' checksums must be identical);
#   3. examples/tms_sleep_wake.py, a program written for torch_memory_saver,
#      under torch_memory_saver itself and through vmmshim's drop-in
#      (`vmmshim run --torch-memory-saver`), alternated ROUNDS times (default
#      2), with a --no-pause reference run: results, CPU backup, and the
#      pause and resume times side by side;
#   4. torch_memory_saver's own examples, if .gpu/tms-examples/*.py holds
#      them, through the drop-in (each is run as `python3 EXAMPLE preload`);
#   5. `vmmshim compare` of a program that prints its timings
#      (examples/torch_step_time.py), without --check.
# Before: tools/gpu/bundle.sh, then tools/build/build-wheel.sh build .gpu/dist
# and the torch_memory_saver wheel in .gpu/wheels (tools/gpu/fetch-wheels.sh).
# usage: tools/gpu/wheel-and-drop-in.sh [ROUNDS]
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
rounds=${1:-2}
status=0
fail() { echo "FAIL: $*"; status=1; }
wheel=$(ls "$root"/.gpu/dist/vmmshim-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "no wheel in .gpu/dist (tools/build/build-wheel.sh build .gpu/dist)"; exit 1; }
work=$(mktemp -d)
echo "== pip install --no-index $(basename "$wheel") into a fresh environment"
python3 -m venv "$work/venv" || exit 1
PIP_DISABLE_PIP_VERSION_CHECK=1 "$work/venv/bin/pip" install --quiet --no-index "$wheel" || exit 1
vm=$work/venv/bin/vmmshim
py=$work/venv/bin/python
# The host's PyTorch (and CuPy, JAX) live in the site-packages of the host's
# python3, itself a virtual environment on these machines: made visible to the
# new one by a .pth file, after the environment's own packages.
host_site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$host_site" > "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/host-packages.pth"
"$vm" --version
"$py" -c 'import vmmshim; print("library:", vmmshim.library_path())'

echo "== examples/train_mlp.py natively and under vmmshim run"
native=$(python3 examples/train_mlp.py 2>&1 | grep '^train_mlp:')
shimmed=$("$vm" run --log-level info -- "$py" examples/train_mlp.py 2>"$out/train_mlp.err" | grep '^train_mlp:')
echo "native:  $native"
echo "vmmshim: $shimmed"
grep -m1 'exit report' "$out/train_mlp.err" | cut -c1-160
[ -n "$native" ] && [ "$native" = "$shimmed" ] || fail "train_mlp differs under vmmshim run"

unpack_tms
tms_run() {  # mode args...
  local mode=$1; shift
  if [ "$mode" = torch_memory_saver ]; then
    PYTHONPATH=$tms_dir LD_PRELOAD=$tms python3 "$@"
  else
    "$vm" run --torch-memory-saver -- "$py" "$@"
  fi
}
if [ -n "$tms_dir" ]; then
  echo "== examples/tms_sleep_wake.py (written for torch_memory_saver), ${KV_GIB:-8} GiB KV cache"
  ref=$(tms_run torch_memory_saver examples/tms_sleep_wake.py --no-pause --kv-gib "${KV_GIB:-8}" 2>&1 |
        grep 'result')
  echo "reference (torch_memory_saver, never paused): $ref"
  csv=$out/tms-drop-in.csv
  echo "mode,round,phase,seconds" > "$csv"
  for r in $(seq 1 "$rounds"); do
    modes=(torch_memory_saver vmmshim)
    [ $((r % 2)) = 0 ] && modes=(vmmshim torch_memory_saver)
    for mode in "${modes[@]}"; do
      log=$out/tms-sleep-wake-$mode-$r.log
      tms_run "$mode" examples/tms_sleep_wake.py --kv-gib "${KV_GIB:-8}" > "$log" 2>&1
      result=$(grep 'result' "$log")
      [ "$result" = "$ref" ] || fail "$mode round $r: '$result' (reference '$ref'; $log)"
      grep -q 'cpu backup of a weight while paused: identical' "$log" || fail "$mode round $r: backup ($log)"
      for phase in pause resume; do
        for t in $(sed -n "s/^tms_sleep_wake: $phase s //p" "$log"); do
          echo "$mode,$r,$phase,$t" >> "$csv"
        done
      done
    done
  done
  python3 - "$csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"{'mode':20} {'pause median':>13} {'resume median':>14}  (s; cycles after the first, all rounds)")
for mode in ("torch_memory_saver", "vmmshim"):
    med = {p: statistics.median([float(r["seconds"]) for r in rows
                                 if r["mode"] == mode and r["phase"] == p] or [float("nan")])
           for p in ("pause", "resume")}
    print(f"{mode:20} {med['pause']:13.4f} {med['resume']:14.4f}")
PY
  for ex in "$root"/.gpu/tms-examples/*.py; do
    [ -f "$ex" ] || continue
    name=$(basename "$ex" .py)
    echo "== torch_memory_saver's example $name.py through the drop-in"
    if (cd "$(dirname "$ex")" && tms_run vmmshim "$ex" preload) > "$out/tms-example-$name.log" 2>&1; then
      echo "ok ($(grep -c . "$out/tms-example-$name.log") lines of output)"
    else
      fail "$name.py through the drop-in: $(tail -3 "$out/tms-example-$name.log")"
    fi
  done
else
  echo "no torch_memory_saver wheel in .gpu/wheels: the drop-in is not compared"
fi

echo "== vmmshim compare of a program that prints its timings (no --check)"
"$vm" compare --repeat 2 --out "$out/compare-step-time" -- "$py" examples/torch_step_time.py \
  > "$out/compare-step-time.txt" 2>&1
cat "$out/compare-step-time.txt"
grep -qE '^native +ok' "$out/compare-step-time.txt" && grep -qE '^all +ok' "$out/compare-step-time.txt" ||
  fail "compare of a program printing timings"
exit $status

#!/usr/bin/env bash
# The whole real-GPU validation in one call, run from the repository root on a
# GPU host after tools/gpu/bundle.sh was run on the build machine (the build
# tree lives in .gpu/build). Writes logs to $OUT (or ./gpu-out).
#   - all ctest tests (unit and e2e on the simulated driver, and the gpu label:
#     static-cudart program, parity probe, footprint, driver API, PyTorch)
#   - the full outputs of the parity probe and the footprint runs
set -uo pipefail
source "$(dirname "$0")/host-env.sh"
exec > >(tee "$out/validate.log") 2>&1
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# VALIDATE_SIM=0: skip the simulated-driver tests (CI runs them) to fit one
# device call; GPU_TESTS=REGEX: only those gpu-labelled checks.
if [ "${VALIDATE_SIM:-1}" != 0 ]; then
  (cd "$b" && ctest -LE gpu --output-on-failure 2>&1) > "$out/ctest-sim.txt"
  grep -E "tests passed|Failed|\*\*\*" "$out/ctest-sim.txt"
fi
(cd "$b" && ctest -L gpu ${GPU_TESTS:+-R "$GPU_TESTS"} -V 2>&1) | grep -vE '^(UpdateCTestConfiguration|Parse|Test project|Constructing|Checking|Updating|Add|Test command|Environment)' \
  > "$out/ctest-gpu.txt"
grep -E "^[0-9]+: |tests passed|Failed" "$out/ctest-gpu.txt" | tail -150

echo "== start-up of a non-CUDA process: bench/startup_bench.sh"
bash "$root/bench/startup_bench.sh" "$shim" 300 2>&1 | tail -4
echo "== parity probe, native vs shim"
"$b/examples/parity_probe" > /tmp/parity-native.txt 2>&1
LD_PRELOAD=$shim "$b/examples/parity_probe" > /tmp/parity-shim.txt 2>&1
cp /tmp/parity-native.txt /tmp/parity-shim.txt "$out/"
diff /tmp/parity-native.txt /tmp/parity-shim.txt
echo "PARITY rows: $(grep -c ^PARITY /tmp/parity-native.txt) native, $(grep -c ^PARITY /tmp/parity-shim.txt) shim," \
  "$(diff <(grep ^PARITY /tmp/parity-native.txt) <(grep ^PARITY /tmp/parity-shim.txt) | grep -c '^[<>]') differing lines"
echo "== footprint, three times each"
for i in 1 2 3; do
  echo "native $("$b/examples/footprint" 10000 256)"
  echo "shim   $(LD_PRELOAD=$shim "$b/examples/footprint" 10000 256)"
done
if [ -x "$b/bench/alloc_bench" ]; then
  # A baseline shim build (another commit's libvmmshim.so, bundled into
  # .gpu/baseline by the caller) joins the rotation when present.
  baseline=()
  [ -f "$root/.gpu/baseline/libvmmshim.so" ] && baseline=(--baseline "$root/.gpu/baseline/libvmmshim.so")
  echo "== benchmark: bench/run_bench.sh --rounds 2 ${baseline[*]} build/bench/alloc_bench build/libvmmshim.so OUT"
  bash "$root/bench/run_bench.sh" --rounds 2 "${baseline[@]}" "$b/bench/alloc_bench" "$shim" /tmp/bench
  cp /tmp/bench/results.csv "$out/bench-results.csv"
  [ -f /tmp/bench/chart.png ] && cp /tmp/bench/chart.png "$out/bench-chart.png"
fi

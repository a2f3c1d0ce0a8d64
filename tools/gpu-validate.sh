#!/usr/bin/env bash
# The whole real-GPU validation in one call, run from the repository root on a
# GPU host after tools/gpu-bundle.sh was run on the build machine (the build
# tree lives in .gpu/build). Writes logs to $OUT (or ./gpu-out).
#   - all ctest tests (unit and e2e on the simulated driver, and the gpu label:
#     static-cudart program, parity probe, footprint, driver API, PyTorch)
#   - the full outputs of the parity probe and the footprint runs
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
# The build tree records absolute paths of the build machine (/work/main).
built_at=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' .gpu/build/CMakeCache.txt)
if [ "$built_at" != "$root" ]; then
  mkdir -p "$(dirname "$built_at")" && ln -sfn "$root" "$built_at"
fi
ln -sfn .gpu/build build
export LD_LIBRARY_PATH=$root/.gpu/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
b=$built_at/build
{
  nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} 2>&1 | tee "$out/host.txt"

(cd "$b" && ctest -LE gpu --output-on-failure 2>&1) > "$out/ctest-sim.txt"
grep -E "tests passed|Failed|\*\*\*" "$out/ctest-sim.txt"
(cd "$b" && ctest -L gpu -V 2>&1) | grep -vE '^(UpdateCTestConfiguration|Parse|Test project|Constructing|Checking|Updating|Add|Test command|Environment)' \
  | tee "$out/ctest-gpu.txt" | tail -80

echo "/bin/true under the shim: [$(LD_PRELOAD=$b/libvmmshim.so /bin/true 2>&1)] rc=$?"
"$b/examples/parity_probe" > "$out/parity-native.txt" 2>&1
LD_PRELOAD=$b/libvmmshim.so "$b/examples/parity_probe" > "$out/parity-shim.txt" 2>&1
for i in 1 2 3; do
  echo "native $("$b/examples/footprint" 10000 256)"
  echo "shim   $(LD_PRELOAD=$b/libvmmshim.so "$b/examples/footprint" 10000 256)"
done | tee "$out/footprint.txt"

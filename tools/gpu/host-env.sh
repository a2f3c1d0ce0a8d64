# Sourced by the scripts that run on a GPU host from a bundled build tree
# (tools/gpu/bundle.sh): makes the build tree's recorded absolute paths
# valid there, puts its libraries on the path, and sets
#   out   where logs go ($OUT, else ./gpu-out)
#   root  the repository root
#   b     the build tree
#   shim  libvmmshim.so
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
built_at=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' .gpu/build/CMakeCache.txt)
if [ "$built_at" != "$root" ]; then
  mkdir -p "$(dirname "$built_at")" && ln -sfn "$root" "$built_at"
fi
ln -sfn .gpu/build build
export LD_LIBRARY_PATH=$root/.gpu/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
b=$built_at/build
shim=$b/libvmmshim.so

# held PID (its MiB on nvidia-smi) and alive PID.
source "$root/tools/gpu/process-state.sh"

# The GPU's name and driver, then the gpu-labelled checks into
# $out/ctest-gpu.txt (GPU_CTEST=0 skips them).
gpu_header_and_checks() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  if [ "${GPU_CTEST:-1}" = 1 ]; then
    echo "== ctest -L gpu"
    (cd "$b" && ctest -L gpu --output-on-failure 2>&1) > "$out/ctest-gpu.txt"
    grep -E "tests passed|Failed|\*\*\*|Not Run" "$out/ctest-gpu.txt" | tail -30
  fi
}

# torch_memory_saver from its wheel in .gpu/wheels (tools/gpu/fetch-wheels.sh),
# unpacked into a temporary directory: sets tms_dir (empty when there is no
# wheel) and tms, its preload library for CUDA 13.
unpack_tms() {
  local wheel
  wheel=$(ls "$root"/.gpu/wheels/torch_memory_saver-*.whl 2>/dev/null | head -1)
  tms_dir=""
  if [ -n "$wheel" ]; then
    tms_dir=$(mktemp -d)
    python3 -m zipfile -e "$wheel" "$tms_dir"
  fi
  tms=$tms_dir/torch_memory_saver_hook_mode_preload_cu13.abi3.so
}

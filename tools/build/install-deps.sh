#!/usr/bin/env bash
# Installs the Debian packages vmmshim builds with (idempotent: installs only
# what is missing). The CUDA Toolkit (13.0) is expected to be preinstalled;
# CMake's FindCUDAToolkit finds it under /usr/local/cuda.
set -euo pipefail
# Abseil is not among them: tools/build/build-abseil.sh builds Debian's source with
# -fPIC (curl, patch, xz-utils fetch and unpack it) for libvmmshim.so to link
# statically. python3-wheel and python3-venv: tools/build/build-wheel.sh packs the
# wheel (`python3 -m wheel pack`) and tests/wheel installs it into a fresh venv.
# python3-matplotlib: the charts of `vmmshim compare` (cli/compare/compare_chart.py,
# run as `python3` from PATH), bench/report.py and tools/docs/plot_multi_gpu.py.
packages=(cmake g++ make libspdlog-dev libfmt-dev libgtest-dev libcpptoml-dev
          nlohmann-json3-dev libcli11-dev file binutils pkg-config dpkg-dev clang libclang-rt-14-dev
          python3 python3-wheel python3-venv python3-matplotlib curl patch xz-utils)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian's python3-matplotlib is seen by /usr/bin/python3 only. Where the python3
# on PATH is another interpreter (pyenv, conda, a venv), install matplotlib into
# that one with its pip. The charts are optional: a failure here only warns.
if ! python3 -c "import matplotlib" 2>/dev/null; then
  py=$(python3 -c "import sys; print(sys.executable)" 2>/dev/null || true)
  echo "installing matplotlib with pip for ${py:-python3} (it cannot import Debian's)"
  python3 -m pip install --quiet matplotlib \
    || echo "warning: matplotlib not installed for ${py:-python3}; charts will not be drawn" >&2
fi
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "error: no CUDA Toolkit under /usr/local/cuda or on PATH; vmmshim needs its headers" \
       "(CUDA 13.0) to build" >&2
  exit 1
fi

#!/usr/bin/env bash
# Downloads RAPIDS RMM (CUDA 13 wheels, for the GPU host's Python 3.12) into
# .gpu/wheels, on a machine with network access; the GPU host has none, and
# the gpu_rmm_async check installs them from there into a temporary
# directory (nothing is installed system-wide). numpy is the host's own.
# usage: tools/fetch-rmm-wheels.sh   (after tools/gpu-bundle.sh, which wipes .gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu/wheels
pip download --quiet -d .gpu/wheels "rmm-cu13<26" "cuda-bindings<13.1" --no-deps \
  --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64
pip download --quiet -d .gpu/wheels "librmm-cu13<26" "rapids-logger<0.3" "cuda-python<13.1" \
  "cuda-pathfinder" --no-deps --python-version 3.12 --only-binary=:all: \
  --platform manylinux_2_28_x86_64
ls .gpu/wheels

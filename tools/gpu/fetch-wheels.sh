#!/usr/bin/env bash
# Downloads the Python wheels the GPU checks use but the GPU host lacks (it
# has no network) into .gpu/wheels, on a machine with network access, for the
# host's Python 3.12:
#   - RAPIDS RMM 25.12 (CUDA 13) and its dependencies: gpu_rmm_async;
#   - torch_memory_saver (its preload library for CUDA 13), the closest peer
#     of the shim, for side-by-side runs.
# The checks install them from there into a temporary directory (nothing is
# installed system-wide). numpy is the host's own.
# usage: tools/gpu/fetch-wheels.sh   (after tools/gpu/bundle.sh, which wipes .gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/wheels
common=(--quiet -d .gpu/wheels --no-deps --python-version 3.12 --only-binary=:all:
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64)
pip download "${common[@]}" "rmm-cu13<26" "cuda-bindings<13.1" "librmm-cu13<26" \
  "rapids-logger<0.3" "cuda-python<13.1" "cuda-pathfinder"
pip download "${common[@]}" "torch_memory_saver"
ls .gpu/wheels

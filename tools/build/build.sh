#!/usr/bin/env bash
# Configures and builds vmmshim into build/ (after installing dependencies and
# building, once, the static abseil every build configuration uses).
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/build/install-deps.sh
tools/build/build-abseil.sh
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=$PATH:/usr/local/cuda/bin
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# TARGET...: only those (and what they need); none: everything.
cmake --build build -j"$(nproc)" ${1:+--target "$@"}

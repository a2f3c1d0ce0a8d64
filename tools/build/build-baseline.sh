#!/usr/bin/env bash
# Builds libvmmshim.so as it is at git revision REV (default: main) into
# build/baseline/libvmmshim-<short hash>.so, for bench/run_bench.sh --baseline
# (tools/gpu/bench-alloc.sh uses it when present). Named by the hash, not
# REV, so that a moving name such as main never passes off one build as
# another's. Uses the abseil of build-deps/absl (tools/build/build-abseil.sh).
# usage: tools/build/build-baseline.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:-main}
hash=$(git rev-parse --verify --short "$rev^{commit}") ||
  { echo "error: '$rev' is not a revision of this repository" >&2; exit 1; }
out=build/baseline/libvmmshim-$hash.so
work=$(mktemp -d)
trap 'git worktree remove --force "$work/src" >/dev/null 2>&1; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/src" "$hash"
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVMMSHIM_ABSL_PREFIX="$PWD/build-deps/absl" -DVMMSHIM_BUILD_TESTS=OFF \
  -DVMMSHIM_BUILD_EXAMPLES=OFF -DVMMSHIM_BUILD_BENCH=OFF >/dev/null
cmake --build "$work/build" -j"$(nproc)" --target vmmshim >/dev/null
mkdir -p build/baseline
cp "$work/build/libvmmshim.so" "$out"
echo "$out"

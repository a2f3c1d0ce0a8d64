#!/usr/bin/env bash
# Builds libvmmshim.so as it was at git revision REV (default fa766d1, the
# allocator before issue 13's per-thread front end) into
# build/baseline/libvmmshim-REV.so, for bench/run_bench.sh --baseline
# (tools/gpu-issue13.sh uses it when present). Uses the abseil of
# build-deps/absl (tools/build-abseil.sh).
# usage: tools/build-baseline.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-fa766d1}
work=$(mktemp -d)
trap 'git worktree remove --force "$work/src" >/dev/null 2>&1; rm -rf "$work"' EXIT
git worktree add -q "$work/src" "$rev"
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVMMSHIM_ABSL_PREFIX="$PWD/build-deps/absl" -DVMMSHIM_BUILD_TESTS=OFF \
  -DVMMSHIM_BUILD_EXAMPLES=OFF -DVMMSHIM_BUILD_BENCH=OFF >/dev/null
cmake --build "$work/build" -j"$(nproc)" --target vmmshim >/dev/null
mkdir -p build/baseline
cp "$work/build/libvmmshim.so" "build/baseline/libvmmshim-$rev.so"
echo "build/baseline/libvmmshim-$rev.so"

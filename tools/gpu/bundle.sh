#!/usr/bin/env bash
# Packs the build tree for a GPU host that lacks the build's dependencies: a
# copy of BUILD_DIR without object files, stripped of debug info, in
# .gpu/build. libvmmshim.so is self-contained (abseil and the C++ runtime
# linked in: docs/architecture.md) and so are the test and bench programs
# (abseil and gtest static), so no library is copied; the bundle refuses a
# program that needs a shared library outside the system and the build tree.
# tools/gpu/validate.sh runs the checks from there.
# usage: tools/gpu/bundle.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
rm -rf .gpu && mkdir -p .gpu/build
tar -C "$build" --exclude='*.o' --exclude='*.a' --exclude='CMakeFiles' -cf - . | tar -C .gpu/build -xf -
# `cmake --install` on the GPU host needs the generated export files.
if [ -d "$build/CMakeFiles/Export" ]; then
  mkdir -p .gpu/build/CMakeFiles && cp -r "$build/CMakeFiles/Export" .gpu/build/CMakeFiles/
fi
find .gpu/build -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c \
  'file -b "$1" | grep -q ^ELF && strip --strip-debug "$1"' _ {} \;
# A GPU host (Ubuntu 24.04) has glibc, libstdc++, libgcc, the driver and the
# CUDA Toolkit (libcudart.so.13, for examples/cudart_loop, built with the
# shared cudart for the torch_memory_saver comparison); a
# library of the build tree is found there through the tree's own paths
# (tools/gpu/host-env.sh).
system='^(linux-vdso|ld-linux|libcudart\.|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libgcc_s\.|libstdc\+\+\.|libcuda\.|libnvidia)'
missing=$(find "$build" -path '*/CMakeFiles' -prune -o -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
  while IFS= read -r -d '' f; do
    file -b "$f" | grep -q '^ELF' || continue
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
      while read -r name path; do
        [[ $name =~ $system ]] && continue
        [[ $path == "$(realpath "$build")"/* ]] && continue
        echo "$f needs $path"
      done
  done)
if [ -n "$missing" ]; then
  echo "error: a GPU host may lack these libraries:"; echo "$missing"; exit 1
fi
# torch_memory_saver's own test suite (gpu_tms_suite), when this checkout
# has the peers beside it: the GPU host gets the working tree only.
if [ -d ../shared/peers/torch_memory_saver/test ]; then
  mkdir -p .gpu/peers && cp -r ../shared/peers/torch_memory_saver .gpu/peers/
fi
echo "bundled $(du -sh .gpu | cut -f1) into .gpu/build (the build tree; no library outside it needed)"

#!/usr/bin/env bash
# Packs the build tree for a GPU host that lacks the build's dependencies
# (abseil): a copy of BUILD_DIR without object files, stripped of debug info,
# in .gpu/build, with the non-system shared libraries its programs need copied
# next to libvmmshim.so (found through its DT_RPATH $ORIGIN).
# tools/gpu-validate.sh runs the checks from there.
# usage: tools/gpu-bundle.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rm -rf .gpu && mkdir -p .gpu/build
tar -C "$build" --exclude='*.o' --exclude='*.a' --exclude='CMakeFiles' -cf - . | tar -C .gpu/build -xf -
find .gpu/build -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c \
  'file -b "$1" | grep -q ^ELF && strip --strip-debug "$1"' _ {} \;
# Shared libraries the programs need that a GPU host may not have.
system='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libgcc_s\.|libstdc\+\+\.|libcuda\.|libnvidia)'
find .gpu/build -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
  while IFS= read -r -d '' f; do
    file -b "$f" | grep -q '^ELF' || continue
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
      while read -r name path; do
        [[ $name =~ $system ]] && continue
        [[ $path == "$PWD"/* || $path == */build/* ]] && continue
        [ -e ".gpu/build/$name" ] || cp -L "$path" ".gpu/build/$name"
      done
  done
echo "bundled $(du -sh .gpu | cut -f1) into .gpu/build (the build tree and, next to libvmmshim.so, the libraries it needs)"

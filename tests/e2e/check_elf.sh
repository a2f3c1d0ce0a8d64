#!/usr/bin/env bash
# The exported symbols of libvmmshim.so are exactly the version script's
# globals, and it has no DT_NEEDED on libcuda or libcudart.
# usage: check_elf.sh LIBVMMSHIM VERSION_SCRIPT
set -euo pipefail
export LC_ALL=C  # one sort order on every host (Ubuntu and Debian differ)
lib=$1 map=$2
want=$(sed -n '/global:/,/local:/p' "$map" | grep -oE '^\s*[A-Za-z_][A-Za-z0-9_]*;' | tr -d ' ;' | sort)
# (version-node symbols, type A, are not exports; dlsym has two versions)
have=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | sed 's/@.*//' | sort -u)
if [ "$want" != "$have" ]; then
  echo "exports differ from $map:"; diff <(echo "$want") <(echo "$have") || true; exit 1
fi
echo "exports: $(echo $have)"
if [ "$(uname -m)" = x86_64 ]; then
  versions=$(nm -D --defined-only "$lib" | awk '$3 ~ /^dlsym@/ {print $3}' | sort | tr '\n' ' ')
  echo "dlsym versions: $versions"
  [ "$versions" = "dlsym@@GLIBC_2.34 dlsym@GLIBC_2.2.5 " ] || { echo "dlsym must be defined as dlsym@@GLIBC_2.34 and dlsym@GLIBC_2.2.5"; exit 1; }
fi
needed=$(readelf -d "$lib" | awk '/NEEDED/ {print $NF}' | tr -d '[]')
echo "NEEDED: $(echo $needed)"
if echo "$needed" | grep -qE '^libcuda(rt)?\.so'; then
  echo "libvmmshim.so must not need libcuda or libcudart"; exit 1
fi

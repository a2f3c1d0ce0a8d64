#!/usr/bin/env bash
# The exported symbols of libvmmshim.so are exactly the version script's
# globals, and it has no DT_NEEDED on libcuda or libcudart.
# usage: check_elf.sh LIBVMMSHIM VERSION_SCRIPT
set -euo pipefail
lib=$1 map=$2
want=$(sed -n '/global:/,/local:/p' "$map" | grep -oE '^\s*[A-Za-z_][A-Za-z0-9_]*;' | tr -d ' ;' | sort)
have=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort)
if [ "$want" != "$have" ]; then
  echo "exports differ from $map:"; diff <(echo "$want") <(echo "$have") || true; exit 1
fi
echo "exports: $(echo $have)"
needed=$(readelf -d "$lib" | awk '/NEEDED/ {print $NF}' | tr -d '[]')
echo "NEEDED: $(echo $needed)"
if echo "$needed" | grep -qE '^libcuda(rt)?\.so'; then
  echo "libvmmshim.so must not need libcuda or libcudart"; exit 1
fi

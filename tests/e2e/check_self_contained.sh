#!/usr/bin/env bash
# libvmmshim.so is self-contained: abseil (and the C++ runtime, unless built
# with -DVMMSHIM_STATIC_CXX_RUNTIME=OFF) are linked in, hidden.
#   elf LIB   its DT_NEEDED are system libraries only, it has no RPATH or
#             RUNPATH (which would change the host's library search), and no
#             dynamic symbol, defined or undefined, is abseil's (no symbol
#             lookup can reach a host program's abseil)
#   maps LIB  a process that never touches CUDA, run under LD_PRELOAD=LIB,
#             maps no shared object but LIB and system libraries
# usage: check_self_contained.sh elf|maps LIB
set -euo pipefail
export LC_ALL=C  # one sort order on every host
mode=$1 lib=$2
# What glibc, libstdc++ and libgcc install: the only libraries allowed.
# (A mapping shows the file's own name, e.g. libstdc++.so.6.0.30.)
system='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1|ld-linux[-a-z0-9_]*\.so\.[0-9]+)(\.[0-9]+)*$'
bad=0
case $mode in
  elf)
    needed=$(readelf -d "$lib" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]')
    echo "NEEDED: $(echo $needed)"
    for n in $needed; do
      [[ $n =~ $system ]] || { echo "not a system library: $n"; bad=1; }
    done
    if readelf -d "$lib" | grep -E '\((RPATH|RUNPATH)\)'; then
      echo "libvmmshim.so must have no RPATH or RUNPATH"; bad=1
    fi
    absl=$(nm -D "$lib" | grep -E 'absl' || true)
    if [ -n "$absl" ]; then
      echo "abseil symbols in the dynamic symbol table:"; echo "$absl" | head -20; bad=1
    fi
    ;;
  maps)
    # cat reads its own /proc/self/maps: everything the loader mapped.
    native=$(env -u LD_PRELOAD cat /proc/self/maps | awk '$6 ~ /\.so(\.|$)/ {print $6}' | sort -u)
    shim=$(LD_PRELOAD=$lib cat /proc/self/maps | awk '$6 ~ /\.so(\.|$)/ {print $6}' | sort -u)
    echo "mapped without the shim: $(echo $native)"
    echo "mapped with the shim:    $(echo $shim)"
    grep -qxF "$(realpath "$lib")" <<<"$shim" || { echo "$lib is not mapped: test broken"; exit 1; }
    for path in $shim; do
      [ "$path" = "$(realpath "$lib")" ] && continue
      [[ $(basename "$path") =~ $system ]] || { echo "not a system library: $path"; bad=1; }
    done
    ;;
  *) echo "usage: $0 elf|maps LIB" >&2; exit 2 ;;
esac
exit $bad

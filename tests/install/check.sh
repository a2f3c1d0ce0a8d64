#!/usr/bin/env bash
# Installs the build tree into a staging prefix and uses it as a user would:
# the files in place, `vmmshim --version`, `vmmshim run` finding the
# installed library without --lib, pkg-config, and a consumer project built
# with find_package(vmmshim); then the .deb (cpack -G DEB), unpacked, with
# its `vmmshim --version`; `vmmshim compare` from the install on the
# simulated driver; `vmmshim trace` finding its script.
# usage: check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1") src=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/stage
cmake --install "$build" --prefix "$stage" >/dev/null
for f in lib/libvmmshim.so bin/vmmshim include/vmmshim/vmmshim.h \
         lib/cmake/vmmshim/vmmshimConfig.cmake lib/cmake/vmmshim/vmmshimConfigVersion.cmake \
         lib/cmake/vmmshim/vmmshimTargets.cmake lib/pkgconfig/vmmshim.pc \
         share/doc/vmmshim/README.md share/doc/vmmshim/performance.md \
         share/doc/vmmshim/compare.md share/vmmshim/compare_chart.py share/vmmshim/memory_trace.py \
         share/doc/vmmshim/LICENSE share/doc/vmmshim/copyright; do
  [ -e "$stage/$f" ] || { echo "missing after install: $f"; exit 1; }
done
# Stripped by default (VMMSHIM_INSTALL_STRIP): the debug info stays in the build tree.
for f in lib/libvmmshim.so bin/vmmshim; do
  file -L "$stage/$f" | grep -q ', stripped' || { echo "installed $f is not stripped: $(file -L "$stage/$f")"; exit 1; }
done
version=$(sed -n 's/^project(vmmshim VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ "$("$stage/bin/vmmshim" --version)" = "vmmshim $version" ] ||
  { echo "vmmshim --version: $("$stage/bin/vmmshim" --version)"; exit 1; }
# vmmshim run preloads the installed library (../lib next to bin).
preload=$("$stage/bin/vmmshim" run -- /bin/sh -c 'echo "$LD_PRELOAD"')
[ "$preload" = "$stage/bin/../lib/libvmmshim.so" ] || { echo "vmmshim run preloaded: $preload"; exit 1; }
# vmmshim compare from the install: the installed library preloaded (its
# statistics show served allocations), the installed chart script found.
if [ ! -x "$build/examples/peer_exchange" ]; then
  echo "note: examples not built (VMMSHIM_BUILD_EXAMPLES=OFF): the installed compare is not run"
else
  LD_LIBRARY_PATH=$build/simcuda SIMCUDA_DEVICES=2 "$stage/bin/vmmshim" compare --policies all --wide \
    --repeat 1 --warmup 0 --out "$work/compare" -- "$build/examples/peer_exchange" \
    > "$work/compare.txt" 2>&1 ||
    { cat "$work/compare.txt"; echo "installed vmmshim compare failed"; exit 1; }
  grep -qE '^all +ok .* 402 ' "$work/compare.txt" ||
    { cat "$work/compare.txt"; echo "installed compare: no allocations served"; exit 1; }
  ! grep -q 'compare_chart.py not found' "$work/compare.txt" ||
    { echo "installed compare did not find share/vmmshim/compare_chart.py"; exit 1; }
fi
# vmmshim trace from the install runs share/vmmshim/memory_trace.py (which names the file).
trace_err=$("$stage/bin/vmmshim" trace "$work/none.pickle" 2>&1 >/dev/null || true)
grep -q "^vmmshim trace: $work/none.pickle: cannot read it" <<<"$trace_err" ||
  { echo "installed vmmshim trace: $trace_err"; exit 1; }
if command -v pkg-config >/dev/null; then
  cflags=$(PKG_CONFIG_PATH=$stage/lib/pkgconfig pkg-config --cflags vmmshim | xargs)
  [ "$(realpath -m "${cflags#-I}")" = "$(realpath "$stage/include")" ] ||
    { echo "pkg-config --cflags: $cflags"; exit 1; }
fi
cmake -S "$src/tests/install/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$stage" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"
# The Debian package.
(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/deb" >/dev/null)
deb=$(ls "$work"/deb/*.deb)
dpkg-deb -c "$deb" > "$work/contents"
for f in ./usr/lib/libvmmshim.so ./usr/bin/vmmshim ./usr/share/vmmshim/compare_chart.py \
         ./usr/share/vmmshim/memory_trace.py \
         ./usr/share/doc/vmmshim/copyright; do
  grep -q "$f" "$work/contents" || { echo "no $f in $deb"; exit 1; }
done
# Its dependencies come from the binaries (dpkg-shlibdeps): at least the
# glibc whose symbols libvmmshim.so uses (2.35: cmake/glibc_floor.c).
depends=$(dpkg-deb -f "$deb" Depends)
glibc=$(sed -n 's/.*libc6 (>= \([0-9.]*\)).*/\1/p' <<<"$depends")
need=$(objdump -T "$build/libvmmshim.so" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
[ -n "$glibc" ] && [ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | head -1)" = "$need" ] ||
  { echo "Depends: $depends (libvmmshim.so needs GLIBC_$need)"; exit 1; }
dpkg-deb -x "$deb" "$work/unpacked"
[ "$("$work/unpacked/usr/bin/vmmshim" --version)" = "vmmshim $version" ]
echo "install, consumer and package: ok ($(basename "$deb"))"

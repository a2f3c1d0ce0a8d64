#!/usr/bin/env bash
# Packs the vmmshim wheel from a CMake build (default build/, which
# tools/build/build.sh makes), the same build and version the .deb comes from
# (cpack -G DEB in that build):
#   vmmshim/                  the Python API (python/vmmshim)
#   vmmshim/lib/libvmmshim.so the preload library, stripped
#   vmmshim/lib/libvmmshim_tms.so  torch_memory_saver's C entry points (the drop-in)
#   vmmshim/bin/vmmshim       the CLI (run, report, compare, trace), stripped; the
#                             console command `vmmshim` and `python -m vmmshim`
#                             run it (vmmshim/__main__.py)
#   vmmshim/share/vmmshim/compare_chart.py   compare's chart
#   vmmshim/share/vmmshim/memory_trace.py    trace's snapshot converter
#   vmmshim/include/vmmshim/vmmshim.h        the C API header
#   vmmshim/_tms/torch_memory_saver          the torch_memory_saver drop-in
# One wheel for every Python 3 (py3-none: the library is not a Python
# extension); its platform tag is manylinux_X_Y_<arch> for the newest glibc
# symbol version the two binaries need, read from them (2.35 on Debian 12:
# cmake/glibc_floor.c). Prints the wheel's path.
# usage: tools/build/build-wheel.sh [BUILD_DIR] [OUT_DIR]   (OUT_DIR: BUILD_DIR/dist)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out=${2:-$build/dist}
for f in "$build/libvmmshim.so" "$build/libvmmshim_tms.so" "$build/vmmshim"; do
  [ -x "$f" ] || { echo "build-wheel: no $f (run tools/build/build.sh, or tools/build/build.sh vmmshim vmmshim_cli vmmshim_tms, first)" >&2; exit 1; }
done
# `wheel pack` writes the RECORD and names the file; Debian's python3-wheel
# (tools/build/install-deps.sh) is for the system python3.
py=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import wheel' 2>/dev/null; then
    py=$candidate; break
  fi
done
[ -n "$py" ] || { echo "build-wheel: no python3 with the wheel package (apt-get install python3-wheel)" >&2; exit 1; }

version=$(sed -n 's/^project(vmmshim VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
built=$("$build/vmmshim" --version)
[ "$built" = "vmmshim $version" ] ||
  { echo "build-wheel: $build/vmmshim says '$built', CMakeLists.txt $version: rebuild" >&2; exit 1; }
arch=$(uname -m)
glibc=$(objdump -T "$build/libvmmshim.so" "$build/libvmmshim_tms.so" "$build/vmmshim" | grep -o 'GLIBC_[0-9][0-9.]*' |
        sed 's/GLIBC_//' | sort -V | tail -1)
platform="manylinux_${glibc%%.*}_${glibc#*.}_${arch}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/vmmshim-$version
pkg=$root/vmmshim
mkdir -p "$root"
cp -r python/vmmshim "$pkg"
find "$pkg" -name __pycache__ -prune -exec rm -rf {} +
sed -i "s/^__version__ = .*/__version__ = \"$version\"/" "$pkg/__init__.py"
mkdir -p "$pkg/lib" "$pkg/bin" "$pkg/share/vmmshim" "$pkg/include/vmmshim"
strip --strip-unneeded -o "$pkg/lib/libvmmshim.so" "$build/libvmmshim.so"
strip --strip-unneeded -o "$pkg/lib/libvmmshim_tms.so" "$build/libvmmshim_tms.so"
strip --strip-unneeded -o "$pkg/bin/vmmshim" "$build/vmmshim"
chmod 755 "$pkg/lib/libvmmshim.so" "$pkg/lib/libvmmshim_tms.so" "$pkg/bin/vmmshim"
install -m 755 cli/compare/compare_chart.py "$pkg/share/vmmshim/"
install -m 755 cli/memory_trace.py "$pkg/share/vmmshim/"
install -m 644 include/vmmshim/vmmshim.h "$pkg/include/vmmshim/"

info=$root/vmmshim-$version.dist-info
mkdir -p "$info"
cp LICENSE "$info/LICENSE"
cp cmake/copyright "$info/THIRD_PARTY"
{
  cat <<EOF
Metadata-Version: 2.1
Name: vmmshim
Version: $version
Summary: Preloaded CUDA allocator: VMM-backed device memory, per-allocation peer access, pause and resume by tag
License: Apache-2.0
License-File: LICENSE
License-File: THIRD_PARTY
Requires-Python: >=3.8
Classifier: License :: OSI Approved :: Apache Software License
Classifier: Operating System :: POSIX :: Linux
Classifier: Environment :: GPU :: NVIDIA CUDA
Classifier: Programming Language :: Python :: 3
Description-Content-Type: text/markdown

EOF
  cat python/README.md
} > "$info/METADATA"
cat > "$info/WHEEL" <<EOF
Wheel-Version: 1.0
Generator: vmmshim tools/build/build-wheel.sh
Root-Is-Purelib: false
Tag: py3-none-$platform
EOF
cat > "$info/entry_points.txt" <<EOF
[console_scripts]
vmmshim = vmmshim.__main__:main
EOF
echo vmmshim > "$info/top_level.txt"
mkdir -p "$out"
"$py" -m wheel pack "$root" -d "$out" >/dev/null
wheel="$out/vmmshim-$version-py3-none-$platform.whl"
[ -f "$wheel" ] || { echo "build-wheel: wheel pack did not write $wheel" >&2; exit 1; }
echo "$wheel"

#!/usr/bin/env bash
# Builds the Abseil that libvmmshim.so links statically, once, into
# build-deps/absl (git-ignored); every build configuration (build, build-asan,
# build-tsan, build-tsa, build-fuzz) finds it there (VMMSHIM_ABSL_PREFIX in
# CMakeLists.txt). Debian's libabsl-dev cannot serve: its shared libraries are
# 31 extra DT_NEEDED entries loaded into every preloaded process, and its
# static archives are not position independent (R_X86_64_TPOFF32).
#
# The source is Debian bookworm's, the same as libabsl-dev 20220623.1-1+deb12u2
# (the upstream tarball with Debian's patches: the absl::debian3 inline
# namespace, absl::string_view etc. as their own types, hardened mode, the
# CVE-2025-0838 fix), built static with -fPIC by the default C++ compiler
# (libstdc++). Only the libraries the
# project uses and their dependencies are configured: absl/flags and
# absl/random are left out.
#
# The .dsc is pinned by its sha256 and the tarballs are checked against it.
# Runs again only when the pinned version, this script's build settings or the
# compiler change (stamp file). Needs curl, patch, xz-utils, cmake, c++.
# usage: tools/build/build-abseil.sh [PREFIX]   (default: build-deps/absl)
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=$(realpath -m "${1:-build-deps/absl}")
deps=$(dirname "$prefix")

version=20220623.1
debrev=1+deb12u2
dsc=abseil_${version}-${debrev}.dsc
dsc_sha256=ba731eaced569332fa4ce802a7ff2615ae57ac25beaf2d02f634ef908f2e62c2
# The pool keeps only current versions; snapshot.debian.org keeps this one.
mirrors=("${VMMSHIM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
         http://snapshot.debian.org/archive/debian/20250520T000000Z)
# The default C++ compiler whatever CXX is (the clang configurations link this
# build too; both use libstdc++). -fno-extern-tls-init: every extern
# thread_local of abseil is ABSL_CONST_INIT, and without it cord.cc leaves a
# weak undefined TLS-wrapper symbol (_ZTH...cordz_next_sample) in
# libvmmshim.so's dynamic symbol table, looked up in every loaded library.
# -DNDEBUG: without it abseil's Mutex records every Lock in a process-wide
# deadlock graph under one global lock, so threads on different mutexes
# still wait for each other (seen on the H200: eight threads on eight heap
# arenas reached the rate of one).
cxx=${VMMSHIM_ABSL_CXX:-c++}
flags="-O2 -g -DNDEBUG -fno-extern-tls-init"
stamp="abseil $version-$debrev; $(command -v "$cxx") $("$cxx" --version | head -1); CXXFLAGS=$flags; static PIC; C++17; no flags, random"

mkdir -p "$deps"
exec 9>"$deps/.absl.lock"
flock 9  # two builds of this tree at once: the second waits and reuses
if [ -f "$prefix/vmmshim-stamp" ] && [ "$(cat "$prefix/vmmshim-stamp")" = "$stamp" ]; then
  exit 0
fi

start=$(date +%s)
echo "building abseil $version-$debrev (static, -fPIC) into $prefix, once"
dl=$deps/downloads
mkdir -p "$dl"
fetch() {  # fetch FILE: from the first mirror that has it, unless already here
  [ -s "$dl/$1" ] && return 0
  for m in "${mirrors[@]}"; do
    if curl -fsSL --retry 3 -o "$dl/$1.part" "$m/pool/main/a/abseil/$1"; then
      mv "$dl/$1.part" "$dl/$1"; return 0
    fi
  done
  rm -f "$dl/$1.part"
  echo "error: cannot download $1 from ${mirrors[*]}" >&2; return 1
}
fetch "$dsc"
echo "$dsc_sha256  $dl/$dsc" | sha256sum -c --quiet - ||
  { echo "error: $dsc does not have the pinned sha256" >&2; rm -f "$dl/$dsc"; exit 1; }
# The Checksums-Sha256 lines of the .dsc: " SHA256 SIZE FILE".
files=$(sed -n '/^Checksums-Sha256:/,/^[A-Z]/{/^ /p}' "$dl/$dsc")
while read -r sum _ file; do
  fetch "$file"
  echo "$sum  $dl/$file" | sha256sum -c --quiet - ||
    { echo "error: $file does not match $dsc" >&2; rm -f "$dl/$file"; exit 1; }
done <<<"$files"

src=$deps/absl-src bld=$deps/absl-build
rm -rf "$src" "$bld" "$prefix"
mkdir -p "$src"
tar -C "$src" --strip-components=1 -xzf "$dl/abseil_$version.orig.tar.gz"
tar -C "$src" -xJf "$dl/abseil_$version-$debrev.debian.tar.xz"
while read -r p; do
  [ -n "$p" ] && [ "${p#\#}" = "$p" ] || continue
  patch -d "$src" -p1 -s --fuzz=0 --no-backup-if-mismatch <"$src/debian/patches/$p"
done <"$src/debian/patches/series"
# Not used by the project, nor by the libraries it uses.
sed -i -E '/^add_subdirectory\((flags|random)\)$/d' "$src/absl/CMakeLists.txt"

cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON \
  -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_TESTING=OFF \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
cmake --build "$bld" -j"$(nproc)" >"$deps/absl-build.log" 2>&1 ||
  { tail -40 "$deps/absl-build.log"; echo "error: abseil build failed ($deps/absl-build.log)" >&2; exit 1; }
cmake --install "$bld" >/dev/null
echo "$stamp" >"$prefix/vmmshim-stamp"
rm -rf "$src" "$bld"
echo "abseil built in $(( $(date +%s) - start )) s: $prefix"

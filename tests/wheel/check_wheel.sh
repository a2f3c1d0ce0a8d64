#!/usr/bin/env bash
# The wheel as a Python user gets it: packed from the build
# (tools/build/build-wheel.sh), installed with pip into a fresh virtual
# environment without network (--no-index), then used from there only:
#   - `vmmshim --version` and `python -m vmmshim --version` (the console command
#     and the module run the wheel's own bin/vmmshim);
#   - its platform tag is the glibc floor the binaries need, the binaries are
#     stripped, the licence is in its metadata; `vmmshim trace` finds its
#     script;
#   - `vmmshim run` preloads the wheel's libvmmshim.so into the driver-API demo
#     on the simulated driver (allocations served from VMM);
#   - child processes of `vmmshim run --stats FILE` (a shell's commands)
#     inherit the preload and write FILE.PID each;
#   - the Python tests (tests/python/test_vmmshim.py) import the installed
#     package, without the shim and under it.
# usage: check_wheel.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1") src=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

wheel=$("$src/tools/build/build-wheel.sh" "$build" "$work/dist")
echo "wheel: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
glibc=$(objdump -T "$build/libvmmshim.so" "$build/libvmmshim_tms.so" "$build/vmmshim" |
        grep -o 'GLIBC_[0-9][0-9.]*' |
        sed 's/GLIBC_//' | sort -V | tail -1)
[[ "$wheel" == *"-py3-none-manylinux_${glibc/./_}_$(uname -m).whl" ]] ||
  fail "platform tag of $(basename "$wheel") is not the glibc floor $glibc"

# A fresh environment; pip may not reach any index.
python3 -m venv "$work/venv" || fail "python3 -m venv (apt-get install python3-venv)"
venv=$work/venv/bin
PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/pip" install --quiet --no-index "$wheel" ||
  fail "pip install --no-index $wheel"
site=$("$venv/python" -c 'import os, vmmshim; print(os.path.dirname(vmmshim.__file__))')
[[ "$site" == "$work/venv/"* ]] || fail "vmmshim imported from $site, not the environment"
version=$(sed -n 's/^project(vmmshim VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ "$("$venv/vmmshim" --version)" = "vmmshim $version" ] || fail "vmmshim --version"
[ "$("$venv/python" -m vmmshim --version)" = "vmmshim $version" ] || fail "python -m vmmshim --version"
[ "$("$venv/python" -c 'import vmmshim; print(vmmshim.__version__)')" = "$version" ] ||
  fail "vmmshim.__version__"
for f in lib/libvmmshim.so lib/libvmmshim_tms.so bin/vmmshim; do
  file -L "$site/$f" | grep -q ', stripped' || fail "$f is not stripped"
done
meta=$(ls -d "$work"/venv/lib/python3*/site-packages/vmmshim-"$version".dist-info)
grep -q '^License: Apache-2.0' "$meta/METADATA" || fail "no licence in METADATA"
[ -f "$meta/LICENSE" ] || fail "no LICENSE in the wheel"
[ -f "$site/share/vmmshim/compare_chart.py" ] || fail "no compare_chart.py"
trace_err=$("$venv/vmmshim" trace "$work/none.pickle" 2>&1 >/dev/null || true)
grep -q "^vmmshim trace: $work/none.pickle: cannot read it" <<<"$trace_err" ||
  fail "vmmshim trace from the wheel: $trace_err"

# vmmshim run from the wheel: its library, on the simulated driver.
out=$(cd "$work" && LD_LIBRARY_PATH=$build/simcuda "$venv/vmmshim" run --log-level info -- \
        "$build/examples/driver_api_demo" 2>&1) || fail "vmmshim run driver_api_demo: $out"
grep -q "^driver_api_demo: 1000 allocations .* 0 wrong values" <<<"$out" || fail "demo output: $out"
grep -q "exit report: served 1000 allocations" <<<"$out" || fail "not served by the shim: $out"
preload=$("$venv/vmmshim" run -- /bin/sh -c 'echo "$LD_PRELOAD"')
[ "$(realpath "$preload")" = "$(realpath "$site/lib/libvmmshim.so")" ] || fail "vmmshim run preloaded '$preload'"
# --torch-memory-saver: torch_memory_saver's C entry points too, and the drop-in first.
tms=$("$venv/vmmshim" run --torch-memory-saver -- /bin/sh -c 'echo "$LD_PRELOAD|$PYTHONPATH"')
# Colon-separated, as Python's configure_subprocess writes it (cli/run_options.h).
IFS=: read -r first second rest <<<"${tms%%|*}"
[ "$(realpath "$first")" = "$(realpath "$site/lib/libvmmshim.so")" ] &&
  [ "$(realpath "$second")" = "$(realpath "$site/lib/libvmmshim_tms.so")" ] && [ -z "$rest" ] ||
  fail "vmmshim run --torch-memory-saver preloaded '${tms%%|*}'"
[[ "${tms#*|}" == "$site/_tms"* || "$(realpath -m "${tms#*|}")" == "$(realpath "$site/_tms")"* ]] ||
  fail "vmmshim run --torch-memory-saver: PYTHONPATH '${tms#*|}'"

# Children of `vmmshim run --stats FILE`: one statistics file each.
mkdir -p "$work/stats"
LD_LIBRARY_PATH=$build/simcuda "$venv/vmmshim" run --stats "$work/stats/run.json" -- /bin/sh -c \
  "$build/examples/driver_api_demo >/dev/null && $build/examples/driver_api_demo >/dev/null" ||
  fail "two children under vmmshim run"
children=$(ls "$work/stats" 2>/dev/null | grep -cE '^run\.[0-9]+\.json$' || true)
[ "$children" = 2 ] || fail "children's statistics files: $(ls "$work/stats" 2>&1 | xargs)"
"$venv/vmmshim" report "$(ls "$work"/stats/run.*.json | head -1)" | grep -q "1000" ||
  fail "vmmshim report of a child's file"

# The Python tests against the installed package (not python/ of the source).
cd "$work"
PYTHONPATH= EXPECT_VMMSHIM_LOADED=0 "$venv/python" "$src/tests/python/test_vmmshim.py" 2>&1 |
  tail -1 | grep -q '^OK' || fail "Python tests without the shim"
PYTHONPATH= EXPECT_VMMSHIM_LOADED=1 LD_LIBRARY_PATH=$build/simcuda SIMCUDA_DEVICES=2 \
  LD_PRELOAD=$site/lib/libvmmshim.so "$venv/python" "$src/tests/python/test_vmmshim.py" 2>&1 |
  tail -1 | grep -q '^OK' || fail "Python tests under the shim"
PYTHONPATH= LD_LIBRARY_PATH=$build/simcuda SIMCUDA_DEVICES=1 SIMCUDA_MEMORY_MIB=512 \
  LD_PRELOAD="$site/lib/libvmmshim.so $site/lib/libvmmshim_tms.so" \
  "$venv/python" "$src/tests/python/test_tms_entry_points.py" 2>&1 |
  tail -1 | grep -q '^OK' || fail "the drop-in's entry-point tests under the wheel's libraries"
echo "wheel: installed offline, vmmshim run, children's statistics Python tests and the drop-in's entry points: ok"

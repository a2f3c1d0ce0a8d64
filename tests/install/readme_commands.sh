#!/usr/bin/env bash
# The README's command lines that can run in a test, run as written (read out
# of README.md, not copied here, so that a change there is tested): the
# wheel's, which builds the library, the CLI and the drop-in's entry points
# into build/ and packs the wheel. The first two commands (tools/demo.sh,
# tools/test.sh) are the demo and this suite itself: CI runs the second, and
# the demo's parts are tests of their own (examples, compare, the deep sleep).
# usage: tests/install/readme_commands.sh SOURCE_DIR
set -euo pipefail
src=$1
cd "$src"
# The indented line that packs the wheel.
line=$(grep -E '^    .*tools/build/build-wheel\.sh' README.md | head -1 | sed 's/^    //')
[ -n "$line" ] || { echo "README.md has no indented build-wheel.sh command"; exit 1; }
echo "README: $line"
out=$(bash -c "$line" 2>&1) || { echo "$out" | tail -20; echo "FAILED: the README's wheel command"; exit 1; }
wheel=$(echo "$out" | grep -E '\.whl$' | tail -1)
[ -f "$wheel" ] || { echo "$out" | tail -20; echo "FAILED: no wheel printed (got '$wheel')"; exit 1; }
echo "OK: $wheel"

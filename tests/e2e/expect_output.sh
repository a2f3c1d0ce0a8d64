#!/usr/bin/env bash
# Runs a command; passes when it exits with STATUS (default 0) and its
# combined output contains every PATTERN (extended regex) and none of the
# !PATTERNs.
# usage: expect_output.sh [--status STATUS] PATTERN... -- COMMAND ARGS...
set -uo pipefail
want=0
if [ "${1:-}" = --status ]; then want=$2; shift 2; fi
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns+=("$1"); shift; done
shift
out=$("$@" 2>&1); rc=$?
echo "$out"
[ $rc -eq "$want" ] || { echo "exit status $rc, expected $want"; exit 1; }
for p in "${patterns[@]}"; do
  if [[ $p == !* ]]; then
    if grep -qE -- "${p:1}" <<<"$out"; then echo "unexpected output matching: ${p:1}"; exit 1; fi
  elif ! grep -qE -- "$p" <<<"$out"; then
    echo "missing output matching: $p"; exit 1
  fi
done

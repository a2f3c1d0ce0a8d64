#!/usr/bin/env bash
# VMMSHIM_LOG_FILE with %p writes the log to a file named with the pid.
# usage: log_file.sh PROGRAM (run with LD_PRELOAD and LD_LIBRARY_PATH set)
set -euo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
VMMSHIM_LOG_LEVEL=info VMMSHIM_LOG_FILE="$dir/shim.%p.log" "$1" vmm >/dev/null
files=("$dir"/shim.*.log)
[ -f "${files[0]}" ] || { echo "no log file in $dir"; exit 1; }
[[ ${files[0]} =~ shim\.[0-9]+\.log$ ]] || { echo "pid not substituted: ${files[0]}"; exit 1; }
grep -q "exit report: served [1-9]" "${files[0]}" || { cat "${files[0]}"; exit 1; }
echo "log file ${files[0]}:"; cat "${files[0]}"

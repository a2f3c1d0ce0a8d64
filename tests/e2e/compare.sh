#!/usr/bin/env bash
# `vmmshim compare` on the simulated driver with 4 devices: examples/peer_exchange
# natively and under all, none and min-size:1M; the table, the failure of
# none with its denials, the files; --check, time limits and bad input.
# usage: compare.sh VMMSHIM_BINARY PEER_EXCHANGE DRIVER_API_DEMO
#        (LD_LIBRARY_PATH: the simulated driver)
set -uo pipefail
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }  # some runs cd elsewhere
cli=$(abs "$1") app=$(abs "$2") demo=$(abs "$3")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
unset LD_PRELOAD
export SIMCUDA_DEVICES=4
# A policy setting of the caller's must not reach the native runs.
out=$(VMMSHIM_PEER_POLICY=none "$cli" compare --policies all,none,min-size:1M --repeat 2 \
      --out "$dir/c" -- "$app" 2>"$dir/progress"); rc=$?
echo "$out"
[ $rc = 1 ] || fail "exit status $rc, wanted 1 (policy none fails)"
grep -q "run 12 of 12" "$dir/progress" || fail "not 12 runs: $(cat "$dir/progress")"
grep -qE "^native +ok " <<<"$out" || fail "native row"
grep -qE "^all +ok " <<<"$out" || fail "all row"
grep -qE "^none +FAILED \(2/2\) " <<<"$out" || fail "none row"
grep -qE "^min-size:1M +ok " <<<"$out" || fail "min-size row"
grep -q "none: exit 1 (native: exit 0); last line of stderr: peer_exchange: device 0 cannot read device 1's exchange buffer: CUDA_ERROR_ILLEGAL_ADDRESS" <<<"$out" \
  || fail "none's failure is not explained"
grep -qE "201 allocation\(s\) of device 0 denied to peer 1, .* and 8 more pairs \(2412 denials in all\)" <<<"$out" \
  || fail "denials of none"
grep -qE "^    \[vmmshim [0-9]+\] info: peer [0-9] denied access to" <<<"$out" || fail "denial log lines"
python3 - "$dir/c" <<'PY' || fail "files"
import csv, json, os, sys
d = sys.argv[1]
rows = {r["policy"]: r for r in csv.DictReader(open(os.path.join(d, "summary.csv")))}
assert set(rows) == {"native", "all", "none", "min-size:1M"}, rows.keys()
mib = 2**20
# 4 devices x 3 peers: all maps every allocation of each device into each
# peer, min-size:1M only the 8 MiB exchange buffers, none nothing.
assert float(rows["min-size:1M"]["mapped_into_peers_bytes"]) == 12 * 8 * mib, rows["min-size:1M"]
assert float(rows["all"]["mapped_into_peers_bytes"]) >= 12 * (200 * 256 * 1024 + 8 * mib), rows["all"]
assert float(rows["none"]["mapped_into_peers_bytes"]) == 0
assert float(rows["all"]["grants"]) == 12 * 201 and float(rows["all"]["denials"]) == 0
assert float(rows["min-size:1M"]["grants"]) == 12 and float(rows["min-size:1M"]["denials"]) == 12 * 200
for p in ("all", "none", "min-size:1M"):
    assert float(rows[p]["peer_enable_calls"]) == 12 and float(rows[p]["peer_enable_seconds"]) > 0, rows[p]
    assert float(rows[p]["served_allocations"]) == 4 * 201, rows[p]
assert rows["native"]["served_allocations"] == "" and float(rows["native"]["wall_median_s"]) > 0
doc = json.load(open(os.path.join(d, "compare.json")))
assert len(doc["runs"]) == 12 and sum(not r["warmup"] for r in doc["runs"]) == 8
none = [m for m in doc["modes"] if m["policy"] == "none"][0]
assert none["failed_runs"] == 2 and len(none["denials_by_pair"]) == 12 and none["denial_log"]
runs = list(csv.DictReader(open(os.path.join(d, "runs.csv"))))
assert len(runs) == 12
# Alternating: the counted rounds start at different modes.
counted = [r["policy"] for r in runs if r["warmup"] == "0"]
assert counted[:4] == ["native", "all", "none", "min-size:1M"], counted
# Round 1: rotated by one and reversed (neighbours change too).
assert counted[4:] == ["native", "min-size:1M", "none", "all"], counted
print("files OK")
PY
# The default table fits 100 columns; --wide has every column.
table=$(sed -n '/^policy /,/^$/p' <<<"$out")
[ "$(wc -L <<<"$table")" -le 100 ] || fail "default table wider than 100: $table"
! grep -q "cuCtxEnablePeerAccess" <<<"$table" || fail "a --wide column in the default table"
if grep -q "^chart: $dir/c/compare.png" <<<"$out"; then
  [ -s "$dir/c/compare.png" ] || fail "chart announced but missing"
else
  grep -q "^chart: not drawn (matplotlib cannot be imported" <<<"$out" || fail "chart line"
fi

out=$("$cli" compare --policies all --repeat 1 --warmup 1 --wide --out "$dir/wide" -- "$app" \
      2>/dev/null); rc=$?
[ $rc = 0 ] || fail "--wide run: $rc: $out"
grep -qE "^policy +result +wall \(median\) .* cuCtxEnablePeerAccess$" <<<"$out" \
  || fail "--wide lacks columns: $out"

# No --out: a new directory under $TMPDIR, named at the end; nothing in the
# current directory.
mkdir -p "$dir/cwd" "$dir/tmp"
out=$(cd "$dir/cwd" && TMPDIR="$dir/tmp" "$cli" compare --policies all --repeat 1 --warmup 0 \
      -- "$app" 2>/dev/null); rc=$?
[ $rc = 0 ] || fail "default directory run: $rc: $out"
[ -z "$(ls -A "$dir/cwd")" ] || fail "wrote into the current directory: $(ls -A "$dir/cwd")"
made=$(sed -n "s|^files in \($dir/tmp/vmmshim-compare-[^:]*\): .*|\1|p" <<<"$out")
[ -n "$made" ] && [ -s "$made/compare.json" ] || fail "default directory not named: $out"

# A program that prints its own timings: the lines that differ between
# native runs are left out for every mode, and said; a policy that changes
# a line stable across native runs is still caught.
out=$("$cli" compare --policies all,min-size:1M --out "$dir/v" -- /bin/bash -c \
      '"$0" >/dev/null; echo "time: $RANDOM$RANDOM ms"; echo "result 42"' "$app" 2>/dev/null); rc=$?
echo "$out"
[ $rc = 0 ] || fail "timings compared as results: $rc: $out"
grep -qE "^native +ok " <<<"$out" && grep -qE "^all +ok " <<<"$out" \
  || fail "timings compared as results: $out"
grep -q "left out of the comparison (every mode): 1 line that differs between the 4 native runs" \
  <<<"$out" || fail "varying line not said: $out"
grep -qE "^    line 1: 'time: [0-9]+ ms', 'time: [0-9]+ ms'" <<<"$out" || fail "varying texts: $out"
out=$("$cli" compare --policies all --out "$dir/v2" -- /bin/bash -c \
      '"$0" >/dev/null; echo "time: $RANDOM$RANDOM ms"; echo "result ${VMMSHIM_PEER_POLICY:-42}"' \
      "$app" 2>/dev/null); rc=$?
[ $rc = 1 ] || fail "a changed stable line was not caught: $rc: $out"
grep -q "all: standard output differs from native: line 2: 'result all' instead of 'result 42'" \
  <<<"$out" || fail "stable line difference: $out"

# --check: only the lines that must agree.
out=$("$cli" compare --policies all --repeat 1 --warmup 0 --check '^peer_exchange:' \
      --out "$dir/k" -- "$app" 2>/dev/null); rc=$?
[ $rc = 0 ] || fail "--check run: $rc: $out"
grep -q "the lines matching '\^peer_exchange:'" <<<"$out" || fail "--check not reported"

# A run that hangs is killed at the time limit and reported; the table still comes.
out=$("$cli" compare --policies all --repeat 1 --warmup 0 --timeout 1 --out "$dir/t" -- \
      /bin/sh -c 'test -z "$VMMSHIM_PEER_POLICY" || sleep 30' 2>/dev/null); rc=$?
[ $rc = 1 ] || fail "timeout run: $rc"
grep -q "all: timed out (killed) (native: exit 0)" <<<"$out" || fail "timeout not reported: $out"

# The driver-API demo prints nothing that depends on the allocator: ok.
out=$("$cli" compare --policies all --repeat 1 --warmup 0 --out "$dir/o" -- "$demo" 2>/dev/null); rc=$?
[ $rc = 0 ] && grep -qE "^all +ok " <<<"$out" || fail "driver_api_demo under the shim: $rc: $out"

# Output that differs under the shim (a line stable across native runs),
# shown around the difference.
out=$("$cli" compare --policies all --repeat 1 --warmup 0 --out "$dir/d" -- /bin/sh -c \
      "$app >/dev/null; if [ -n \"\$VMMSHIM_PEER_POLICY\" ]; then echo 'range 2097152 bytes'; else echo 'range 512 bytes'; fi" \
      2>/dev/null); rc=$?
[ $rc = 1 ] || fail "differing output: $rc: $out"
grep -q "all: standard output differs from native: line 1: 'range 2097152 bytes' instead of 'range 512 bytes'" <<<"$out" \
  || fail "output difference: $out"

# Warm-up runs absorb first-run effects: the reference is the first counted native run.
out=$("$cli" compare --policies all --repeat 2 --warmup 1 --out "$dir/w" -- /bin/sh -c \
      "if [ -e '$dir/seen' ]; then echo \$0; else touch '$dir/seen'; echo compiling; fi; $app" \
      2>/dev/null); rc=$?
[ $rc = 0 ] || fail "warm-up output taken as the reference: $out"

# Output that is not UTF-8 is quoted in compare.json, not refused.
out=$("$cli" compare --policies all --repeat 1 --warmup 0 --out "$dir/u" -- /bin/sh -c \
      "$app >/dev/null; printf '\\377\\376 %s\\n' \"\${VMMSHIM_PEER_POLICY:-native}\"" 2>&1); rc=$?
[ $rc = 1 ] || fail "non-UTF-8 output: $rc: $out"
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$dir/u/compare.json" || fail "compare.json"

# A program that never uses CUDA has no shim in it: NO SHIM, exit status 2.
out=$("$cli" compare --policies all --repeat 1 --warmup 0 --out "$dir/n" -- /bin/true 2>/dev/null); rc=$?
[ $rc = 2 ] || fail "no shim: $rc"
grep -qE "^all +NO SHIM" <<<"$out" && grep -q "all: no run wrote a statistics file" <<<"$out" \
  || fail "no shim not reported: $out"

# Bad input: one message naming it, exit status 2.
expect_error() {  # expect_error MESSAGE ARGS...
  local msg=$1; shift
  local text; text=$("$cli" compare --out "$dir/e" "$@" 2>&1); local rc=$?
  [ $rc = 2 ] || fail "exit status $rc, wanted 2: $*"
  grep -qF -- "$msg" <<<"$text" || fail "message for $*: $text"
}
expect_error "policy 'bogus' is not one of" --policies all,bogus -- "$app"
expect_error "min-size needs a byte count" --policies min-size:lots -- "$app"
expect_error "/nonexistent.toml: cannot open the rules file" --policies rules:/nonexistent.toml -- "$app"
mkdir -p "$dir/sp ace" && cp "$(dirname "$cli")/libvmmshim.so" "$dir/sp ace/"
expect_error "holds a space or colon" --lib "$dir/sp ace/libvmmshim.so" -- "$app"
msg=$("$cli" compare --out "" -- "$app" 2>&1); [ $? = 2 ] || fail "--out '' accepted"
grep -q -- "--out: an empty directory name" <<<"$msg" || fail "--out '': $msg"
expect_error "cannot run '/nonexistent/program': no such program (or not executable)" -- /nonexistent/program
expect_error "is not a regular expression" --check '(' -- "$app"
expect_error "--repeat" --repeat 0 -- "$app"
expect_error "excludes" --check x --same-output -- "$app"
expect_error "File does not exist: /nonexistent.so" --lib /nonexistent.so -- "$app"
expect_error "'abc' is not a number of seconds" --timeout abc -- "$app"
expect_error "PROGRAM is required" --policies all
expect_error "the first counted native run was killed at the time limit" \
  --timeout 0.5 --warmup 0 -- /bin/sleep 10
echo "PASS: compare"

#!/usr/bin/env bash
# The vmmshim launcher: `run` preloads the shim with the chosen settings and
# keeps the program's exit status; `report` prints the statistics file;
# malformed options and files get one clear message; report prints
# compare's compare.json as its table.
# usage: launcher.sh VMMSHIM_BINARY PEER_APP   (LD_LIBRARY_PATH: the simulated driver)
set -uo pipefail
cli=$1 app=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
unset LD_PRELOAD
out=$(SIMCUDA_DEVICES=4 "$cli" run --policy min-size --min-bytes 1M --stats "$dir/s.%p.json" \
      --log-level info -- "$app" 2>&1) || fail "run: $out"
echo "$out"
grep -q "small=fault large=ok tagged=fault later=ok explicit=ok" <<<"$out" || fail "policy not applied"
files=("$dir"/s.*.json)
[ -f "${files[0]}" ] || fail "no statistics file"
rep=$("$cli" report "${files[0]}") || fail "report: $rep"
echo "$rep"
grep -q "policy: min-size" <<<"$rep" || fail "report lacks the policy"
grep -qE "^1 +0 +[0-9]+ +[0-9]+" <<<"$rep" || fail "report lacks device 1 -> peer 0"
"$cli" run -- /bin/sh -c 'exit 7'; [ $? = 7 ] || fail "exit status not kept"
msg=$("$cli" run --policy bogus -- /bin/true 2>&1); [ $? != 0 ] || fail "bad policy accepted"
grep -q "bogus" <<<"$msg" || fail "bad policy message: $msg"
echo "not json" > "$dir/bad.json"
msg=$("$cli" report "$dir/bad.json" 2>&1); [ $? = 1 ] || fail "bad file accepted"
grep -q "is not a vmmshim statistics file" <<<"$msg" || fail "bad file message: $msg"
# report tells the kinds of file apart, in its own words.
echo '{"name": "something else"}' > "$dir/other.json"
msg=$("$cli" report "$dir/other.json" 2>&1); [ $? = 1 ] || fail "other JSON accepted"
grep -qF "other.json is not a vmmshim statistics file (one written by VMMSHIM_STATS_FILE or \`vmmshim run --stats\`): it has no 'pid'" \
  <<<"$msg" || fail "other JSON message: $msg"
! grep -q "json.exception\|not found" <<<"$msg" || fail "the JSON library's words: $msg"
# (The program needs the shim: native exits 2, so all "fails".)
SIMCUDA_DEVICES=4 "$cli" compare --policies all --repeat 1 --warmup 0 --out "$dir/c" -- "$app" \
  >/dev/null 2>&1
[ -s "$dir/c/compare.json" ] || fail "compare wrote no compare.json"
rep=$("$cli" report "$dir/c/compare.json") || fail "report of compare.json: $rep"
echo "$rep"
grep -q "compare.json is vmmshim compare's result file, not a statistics file" <<<"$rep" \
  || fail "compare.json not named: $rep"
grep -qE "^native +ok " <<<"$rep" && grep -qE "^all +FAILED \(1/1\) " <<<"$rep" \
  && grep -q "^- all: exit 0 (native: exit 2)" <<<"$rep" \
  || fail "compare.json's table: $rep"
# Several processes' files (a directory of them) in one report, and as JSON.
mkdir -p "$dir/job"
SIMCUDA_DEVICES=4 "$cli" run --stats "$dir/job/run.json" -- /bin/sh -c "$app >/dev/null; $app >/dev/null" ||
  fail "two children under run --stats"
echo '{"name": "not statistics"}' > "$dir/job/other.json"
rep=$("$cli" report "$dir/job" 2>"$dir/job.err") || fail "report of a directory: $rep"
echo "$rep"
grep -q "^vmmshim statistics of 2 processes" <<<"$rep" || fail "not 2 processes: $rep"
grep -qE "^total +[0-9]+ " <<<"$rep" || fail "no totals row: $rep"
grep -q "skipped .*other.json is not a vmmshim statistics file" "$dir/job.err" || fail "other.json not skipped"
"$cli" report --json "$dir"/job/run.*.json | python3 -c \
  'import json, sys; d = json.load(sys.stdin); assert len(d["processes"]) == 2 and d["totals"]["served_allocations"] > 0, d' ||
  fail "report --json"
# run --snapshot: a relative FILE is taken from where run started (the program changes its
# directory), each child writes FILE.PID, and the exit snapshot shows the cached blocks.
mkdir -p "$dir/snaps"
(cd "$dir/snaps" && SIMCUDA_DEVICES=4 "$cli" run --snapshot s.pickle -- \
   /bin/sh -c "cd / && $app >/dev/null; $app >/dev/null") || fail "two children under run --snapshot"
n=$(ls "$dir"/snaps/s.*.pickle | wc -l)
[ "$n" = 2 ] || fail "run --snapshot: $n child snapshots: $(ls "$dir/snaps")"
python3 -c 'import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
assert d["segments"] and d["vmmshim"]["format"] == 1, d["segments"]' "$(ls "$dir"/snaps/s.*.pickle | head -1)" ||
  fail "run --snapshot: the exit snapshot holds no segments"
# run --torch-memory-saver: torch_memory_saver resolves to the drop-in (the
# source tree's python/vmmshim/_tms from a build tree), the shim preloaded.
out=$(PYTHONPATH=/x "$cli" run --torch-memory-saver -- python3 -c \
      'import os, torch_memory_saver; print(torch_memory_saver.__file__); print(os.environ["PYTHONPATH"])') ||
  fail "run --torch-memory-saver: $out"
grep -q "/python/vmmshim/_tms/torch_memory_saver/__init__.py$" <<<"$out" || fail "drop-in not found: $out"
grep -q ":/x$" <<<"$out" || fail "PYTHONPATH of the program lost: $out"
echo "PASS: launcher"

#!/usr/bin/env bash
# The vmmshim command line: a misspelt option, an unknown subcommand, a
# malformed value or a missing setting gets one line naming it and what was
# expected, a usage line, and exit status 2; --help still exits 0.
# usage: cli_errors.sh VMMSHIM_BINARY
set -uo pipefail
cli=$1
fail() { echo "FAIL: $*"; exit 1; }
unset LD_PRELOAD VMMSHIM_PEER_MIN_BYTES VMMSHIM_CONFIG
checked=0
expect_error() {  # expect_error MESSAGE ARGS...: exit status 2, MESSAGE on stderr
  local msg=$1; shift
  local err; err=$("$cli" "$@" 2>&1 >/dev/null); local rc=$?
  [ $rc = 2 ] || fail "exit status $rc, wanted 2: vmmshim $*: $err"
  grep -qF -- "$msg" <<<"$err" || fail "vmmshim $*: wanted '$msg', got: $err"
  grep -q '^usage: vmmshim' <<<"$err" || fail "vmmshim $*: no usage line: $err"
  checked=$((checked + 1))
}
expect_error "vmmshim compare: unknown option '--polices' (did you mean --policies?)" \
  compare --polices all -- /bin/true
expect_error "vmmshim compare: unknown option '--polices' (did you mean --policies?)" \
  compare --polices=all -- /bin/true
expect_error "vmmshim run: unknown option '--polcy' (did you mean --policy?)" \
  run --polcy none -- /bin/true
expect_error "vmmshim run: unknown option '--verbose'; the program's own options go after --" \
  run /bin/true --verbose
expect_error "vmmshim: unknown subcommand 'runn'; expected one of run, report, compare, trace, ps, sleep, wake, options (did you mean run?)" \
  runn -- /bin/true
expect_error "vmmshim: unknown subcommand 'frobnicate'; expected one of run, report, compare, trace, ps, sleep, wake, options" \
  frobnicate
expect_error "vmmshim: a subcommand is required: run, report, compare, trace, ps, sleep, wake or options"
expect_error "vmmshim: unknown option '--verbose'; expected one of --help, --version" \
  --verbose run -- /bin/true
expect_error "vmmshim compare: --repeat: 'abc' is not a number; expected a whole number from 1 to 1000" \
  compare --repeat abc -- /bin/true
expect_error "vmmshim compare: --warmup: '1.5' is not a number" compare --warmup 1.5 -- /bin/true
expect_error "vmmshim compare: --repeat: 0 is out of range; expected 1 to 1000" \
  compare --repeat 0 -- /bin/true
expect_error "vmmshim run: --policy min-size needs --min-bytes BYTES" \
  run --policy min-size -- /bin/true
expect_error "vmmshim run: --stats: cannot write into '/nonexistent/dir/': No such file or directory" \
  run --stats /nonexistent/dir/s.json -- /bin/true
expect_error "vmmshim run: PROGRAM is required" run
expect_error "vmmshim compare: cannot run 'no-such-program-here': no such program" \
  compare -- no-such-program-here
expect_error "vmmshim run: --min-bytes: '12 parsecs' is not a byte count" \
  run --policy min-size --min-bytes '12 parsecs' -- /bin/true
expect_error "vmmshim run: --policy: 'bogus' is not one of all, none, min-size, rules" \
  run --policy bogus -- /bin/true
expect_error "vmmshim run: --policy rules needs --config FILE" run --policy rules -- /bin/true
expect_error "vmmshim report: unknown option '--jsn' (did you mean --json?)" report --jsn a.json
expect_error "vmmshim compare: --policies: policy 'bogus' is not one of" \
  compare --policies all,bogus -- /bin/true
expect_error "vmmshim trace: SNAPSHOT is required" trace
expect_error "vmmshim trace: unknown option '--outptu' (did you mean --output?)" \
  trace --outptu t.json a.pickle
# trace's own errors (cli/memory_trace.py): one line naming the file, exit status 1.
expect_trace_error() {  # expect_trace_error MESSAGE SNAPSHOT...
  local msg=$1; shift
  local err; err=$("$cli" trace "$@" 2>&1 >/dev/null); local rc=$?
  [ $rc = 1 ] || fail "exit status $rc, wanted 1: vmmshim trace $*: $err"
  [ "$(wc -l <<<"$err")" = 1 ] || fail "vmmshim trace $*: more than one line: $err"
  grep -qF -- "$msg" <<<"$err" || fail "vmmshim trace $*: wanted '$msg', got: $err"
  checked=$((checked + 1))
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
expect_trace_error "vmmshim trace: $tmp/none.pickle: cannot read it: No such file or directory" \
  "$tmp/none.pickle"
echo "not a snapshot" > "$tmp/text.pickle"
expect_trace_error "vmmshim trace: $tmp/text.pickle: not a pickle" "$tmp/text.pickle"
python3 -c 'import pickle, sys; pickle.dump({"a": 1}, open(sys.argv[1], "wb"))' "$tmp/other.pickle"
expect_trace_error "vmmshim trace: $tmp/other.pickle: not a vmmshim memory snapshot" \
  "$tmp/other.pickle"
# The variable stands in for the option, as the shim reads it.
VMMSHIM_PEER_MIN_BYTES=1M "$cli" run --policy min-size -- /bin/true 2>/dev/null \
  || fail "run --policy min-size with VMMSHIM_PEER_MIN_BYTES set refused"
"$cli" run --policy min-size --min-bytes 64KiB -- /bin/true 2>/dev/null \
  || fail "run --min-bytes 64KiB refused"
"$cli" compare --help >/dev/null || fail "compare --help: $?"
"$cli" --help | grep -q "compare" || fail "--help"
echo "PASS: cli_errors ($checked malformed command lines)"

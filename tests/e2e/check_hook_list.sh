#!/usr/bin/env bash
# The hooked driver exports listed in interpose/hook_list.h and the gated
# ones of core/driver/work_submission.h (the lists from which HookFor's table
# is generated) are exactly the cu* globals of the VMMSHIM_1.0 node of the
# version script. Together with check_elf.sh
# (script == `nm -D`) this keeps list, script and exports in step.
# usage: check_hook_list.sh HOOK_LIST_H VERSION_SCRIPT WORK_SUBMISSION_H
set -euo pipefail
export LC_ALL=C  # one sort order on every host
list=$1 map=$2 gated=$3
names() {
  { grep -oE '^\s*X\(cu[A-Za-z0-9_]+,' "$list" | sed -E 's/^\s*X\(//; s/,$//'
    grep -oE '^\s*VMMSHIM_SUBMITS\(X, cu[A-Za-z0-9_]+,' "$gated" | sed -E 's/.*X, //; s/,$//'; }
}
want=$(names | sort)
have=$(sed -n '/^VMMSHIM_1\.0 {/,/^};/p' "$map" | sed -n '/global:/,/local:/p' |
  grep -oE '^\s*cu[A-Za-z0-9_]*;' | tr -d ' ;' | sort)
if [ -z "$want" ]; then echo "no X(cu..., ...) entries found in $list"; exit 1; fi
if [ "$want" != "$have" ]; then
  echo "hooks in $list (<) differ from the cu* globals of VMMSHIM_1.0 in $map (>):"
  diff <(echo "$want") <(echo "$have") || true
  exit 1
fi
dups=$(names | sort | uniq -d)
if [ -n "$dups" ]; then echo "listed twice in $list and $gated: $dups"; exit 1; fi
echo "hooks: $(echo $want | wc -w), in step with $map"

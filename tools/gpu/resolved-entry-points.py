#!/usr/bin/env python3
"""Which driver entry points a real program resolves, each classified as the submission gate
sees it (core/driver/work_submission.h), from the shim's debug log (VMMSHIM_LOG_LEVEL=debug:
one "resolved SYMBOL (cudaVersion V, flags F) -> EXPORT: gated|hooked|driver" line per lookup,
interpose/hooks_resolver.cc).

Each entry point the program resolved is one of:
  gated      submits work; the gate holds it back while closed;
  hooked     one of the shim's own hooks (allocation, peer access, IPC, capture, ...);
  not gated  takes a stream but submits no work (the header's table says why);
  no work    takes no stream and is not a copy, memset or launch: a query, a module or
             context call, an allocation of another kind, ...;
  MISSED     submits work (a family of the gated list, or takes a stream with no reason
             given) but the driver's own function was handed out: a gap in the list.
usage: resolved-entry-points.py WORK_SUBMISSION_H CUDA_INCLUDE_DIR NAME=LOG... ; exits 1 on a
MISSED entry point."""
import re
import sys

FAMILIES = re.compile(r"^cu(Launch|Memcpy|Memset|StreamWait|StreamWrite|StreamBatchMemOp|"
                      r"StreamAddCallback|EventRecord|MemPrefetch|MemDiscard|MemBatchDecompress|"
                      r"MemMapArrayAsync|SignalExternal|WaitExternal|GraphLaunch|GraphUpload|"
                      r"CtxRecordEvent|CtxWaitEvent|GreenCtxRecordEvent|GreenCtxWaitEvent|"
                      r"GraphInstantiateWithParams)")
LINE = re.compile(r"resolved (\S+) \(cudaVersion (\d+), flags (0x[0-9a-f]+)\) -> (\S+): "
                  r"(gated|hooked|driver)")


def main():
    header, include, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
    text = open(header).read()
    ungated = dict(re.findall(r'^\s*X\((cu\w+), "([^"]+)"\)', text, re.M))
    typedefs = open(f"{include}/cudaTypedefs.h").read()
    takes_stream = {base for base, params in
                    re.findall(r"typedef CUresult\s*\(CUDAAPI\s*\*PFN_(cu\w+?)_v\d+(?:_pt[sd][sz])?\)"
                               r"\(([^;]*)\);", typedefs) if "CUstream" in params}
    missed_any = False
    union = {}
    for run in runs:
        name, path = run.split("=", 1)
        seen = {}
        for line in open(path, errors="replace"):
            m = LINE.search(line)
            if not m:
                continue
            symbol, version, flags, export, answer = m.groups()
            per_thread = int(flags, 16) & 1
            key = export if export != "?" else symbol
            if answer == "gated":
                kind = "gated"
            elif answer == "hooked":
                kind = "hooked"
            elif symbol in ungated:
                kind = "not gated: " + ungated[symbol]
            elif FAMILIES.match(symbol) or symbol in takes_stream:
                kind = "MISSED"
            else:
                kind = "no work"
            seen[key] = (kind, symbol, version, per_thread)
        counts = {}
        for kind, *_ in seen.values():
            label = kind.split(":")[0]
            counts[label] = counts.get(label, 0) + 1
        print(f"== {name}: {len(seen)} entry points resolved: " +
              ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for key in sorted(seen):
            kind, symbol, version, per_thread = seen[key]
            if kind != "no work":
                print(f"  {key:44} {kind}")
            union.setdefault(key, kind)
            if kind == "MISSED":
                missed_any = True
    gated = sorted(k for k, v in union.items() if v == "gated")
    print(f"== all runs: {len(union)} entry points, {len(gated)} gated: {' '.join(gated)}")
    missed = sorted(k for k, v in union.items() if v == "MISSED")
    print("== MISSED: " + (" ".join(missed) if missed else "none"))
    return 1 if missed_any else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The gated entry points (core/driver/work_submission.h) are the driver's whole set:
  - every PFN type of cudaTypedefs.h (outside the driver's internal section) whose entry
    point submits work (launches, copies, memsets, stream waits and writes, batched memory
    operations, stream callbacks, event records, prefetches, discards, decompression, sparse
    mappings, external semaphores) is gated under each ABI version and _ptsz/_ptds form;
  - every other PFN type that takes a CUstream is in VMMSHIM_UNGATED_STREAM_ENTRY_POINTS, with
    its reason;
  - every export of those families in the toolkit's stub libcuda.so (when the toolkit has it)
    is gated, or is a 32-bit-pointer ABI export with no public type (named in the header);
  - each gated entry names a PFN type of cudaTypedefs.h, and no name is listed twice.
Prints what it checked; exits 1 naming every gap.
usage: check_work_submission.py WORK_SUBMISSION_H CUDA_INCLUDE_DIR [STUB_LIBCUDA]"""
import os
import re
import subprocess
import sys

FAMILIES = re.compile(r"^cu(Launch|Memcpy|Memset|StreamWait|StreamWrite|StreamBatchMemOp|"
                      r"StreamAddCallback|EventRecord|MemPrefetch|MemDiscard|MemBatchDecompress|"
                      r"MemMapArrayAsync|SignalExternal|WaitExternal|GraphLaunch|GraphUpload|"
                      r"CtxRecordEvent|CtxWaitEvent|GreenCtxRecordEvent|GreenCtxWaitEvent|"
                      r"GraphInstantiateWithParams)")


def main():
    header, include = sys.argv[1], sys.argv[2]
    stub = sys.argv[3] if len(sys.argv) > 3 else os.path.join(include, "..", "lib64", "stubs",
                                                               "libcuda.so")
    text = open(header).read()
    gated = re.findall(r"VMMSHIM_SUBMITS\(X, (cu\w+),[\s\\]*(PFN_\w+)\)", text)
    ungated = dict(re.findall(r'^\s*X\((cu\w+), "([^"]+)"\)', text, re.M))
    typedefs_text = open(os.path.join(include, "cudaTypedefs.h")).read()
    internal = ""
    if "#if defined(__CUDA_API_VERSION_INTERNAL)" in typedefs_text:
        head, rest = typedefs_text.split("#if defined(__CUDA_API_VERSION_INTERNAL)", 1)
        internal, tail = rest.split("#endif", 1)
        typedefs_text = head + tail
    typedefs = re.findall(r"typedef CUresult\s*\(CUDAAPI\s*\*(PFN_(cu\w+?)_v\d+(?:_pt[sd][sz])?)\)"
                          r"\(([^;]*)\);", typedefs_text)
    internal_types = set(re.findall(r"PFN_\w+", internal))
    errors = []

    names = [name for name, _ in gated]
    for name in sorted({n for n in names if names.count(n) > 1}):
        errors.append(f"{name} is listed twice")
    gated_types = {pfn for _, pfn in gated}
    known_types = {t for t, _, _ in typedefs}
    for name, pfn in gated:
        if pfn not in known_types:
            errors.append(f"{name}: {pfn} is not a public type of cudaTypedefs.h")
    for pfn, base, params in typedefs:
        if FAMILIES.match(base):
            if pfn not in gated_types:
                errors.append(f"{pfn} submits work but no gated entry has its type")
        elif "CUstream" in params and base not in ungated:
            errors.append(f"{pfn} takes a CUstream: gate it or name it in "
                          "VMMSHIM_UNGATED_STREAM_ENTRY_POINTS with why")

    exports_checked = 0
    if os.path.exists(stub):
        out = subprocess.run(["nm", "-D", "--defined-only", stub], capture_output=True,
                             text=True, check=True).stdout
        exports = {line.split()[-1] for line in out.splitlines() if line.split()}
        gated_names = set(names)
        for export in sorted(e for e in exports if FAMILIES.match(e)):
            exports_checked += 1
            if export in gated_names:
                continue
            # The unsuffixed 32-bit-pointer ABI (cuMemcpyHtoD, cuMemsetD8, ...): its types
            # are in the driver's internal section only (the header says so).
            if any(t.startswith(f"PFN_{export}_v") for t in internal_types):
                continue
            errors.append(f"the driver exports {export}, which is not gated")
        missing = sorted(set(names) - exports)
        for name in missing:
            errors.append(f"{name} is gated but the stub libcuda.so does not export it")
    else:
        print(f"no stub libcuda.so at {stub}: exports not checked")

    if errors:
        print("\n".join(errors))
        return 1
    print(f"{len(gated)} gated entry points cover {len(gated_types)} PFN types of the families; "
          f"{len(ungated)} stream-taking entry points not gated, each with its reason; "
          f"{exports_checked} driver exports of the families checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Times torch_memory_saver's pause and resume in programs written for it,
under torch_memory_saver itself or vmmshim's drop-in (whichever
`import torch_memory_saver` finds), for tools/gpu/tms-suite.sh:

    python3 tms_timed.py rl_example SUITE_DIR   torch_memory_saver's own
        test/examples/rl_example.py (preload mode), every pause and resume
        call timed;
    python3 tms_timed.py retained [--gib N] [--cycles N]   weights with a
        CPU backup kept across resumes (retain_cpu_backup): pause, change
        nothing, resume, N times; the first cycle (which makes the backup) is
        printed apart from the later ones, and the weights are checked after
        every resume.

Prints lines `tms_timed: WHAT pause|resume SECONDS` and `tms_timed: result ...`.
"""
import argparse
import importlib
import sys
import time

import torch
from torch_memory_saver import torch_memory_saver


def timed(what):
    """Wraps the singleton's pause and resume to print each call's time."""
    for name in ("pause", "resume"):
        original = getattr(torch_memory_saver, name)

        def call(tag=None, _original=original, _name=name):
            torch.cuda.synchronize()
            start = time.perf_counter()
            _original(tag)
            torch.cuda.synchronize()
            print(f"tms_timed: {what} {_name} {time.perf_counter() - start:.4f} tag={tag}",
                  flush=True)

        setattr(torch_memory_saver, name, call)


def rl_example(suite):
    sys.path.insert(0, f"{suite}/test")
    module = importlib.import_module("examples.rl_example")
    timed("rl_example")
    module.time.sleep = lambda _s: None  # its pauses between phases are for a reader
    module.run(hook_mode="preload")
    print("tms_timed: result rl_example ok")


def retained(gib, cycles):
    torch_memory_saver.hook_mode = "preload"
    n = gib << 30
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        weights = torch.empty(n, dtype=torch.uint8, device="cuda")
    weights.copy_(torch.arange(n, device="cuda", dtype=torch.int64).remainder(251).to(torch.uint8))
    expected = weights.sum(dtype=torch.int64).item()
    torch_memory_saver.retain_cpu_backup = True
    for cycle in range(cycles):
        what = "retained-first" if cycle == 0 else "retained"
        for name in ("pause", "resume"):
            torch.cuda.synchronize()
            start = time.perf_counter()
            getattr(torch_memory_saver, name)("weights")
            torch.cuda.synchronize()
            print(f"tms_timed: {what} {name} {time.perf_counter() - start:.4f} "
                  f"({gib} GiB)", flush=True)
        got = weights.sum(dtype=torch.int64).item()
        assert got == expected, f"cycle {cycle}: weights differ after the resume"
    torch_memory_saver.retain_cpu_backup = False
    print(f"tms_timed: result retained {gib} GiB x {cycles} cycles identical")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["rl_example", "retained"])
    parser.add_argument("suite", nargs="?")
    parser.add_argument("--gib", type=int, default=4)
    parser.add_argument("--cycles", type=int, default=4)
    args = parser.parse_args()
    if args.what == "rl_example":
        rl_example(args.suite)
    else:
        retained(args.gib, args.cycles)


if __name__ == "__main__":
    main()

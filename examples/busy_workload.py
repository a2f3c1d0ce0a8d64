"""A PyTorch process that keeps the GPU busy from two threads, to be put to
sleep (`vmmshim sleep PID` / `vmmshim wake PID`) or paused (`vmmshim.pause()`)
at random moments while it works (tools/gpu/busy-sleep.sh, the gpu_busy_sleep
and gpu_busy_pause checks). Pausing or sleeping must never break it: the
shim's submission gate holds the threads' launches and copies and waits for
the work in flight first.

  thread A  bf16 matmuls back to back on the thread's current stream: each
            step makes fresh tensors through PyTorch's allocator
            (x = sin(kv) as bf16, h = x @ w) and adds h into `kv`, a float32
            tensor made under vmmshim.tag("kv"); so kv after the last step
            depends on every step's data (--n 8192: 3.7-4.9 ms a step on an
            H100 with thread B beside it, natively; --steps 5000, the
            default, about 20 s).
  thread B  on a side stream (torch.cuda.Stream), every ~2 ms: a host tensor
            (pinned and pageable in turn, --copy-mib MiB) to a fresh device
            tensor and back into a host tensor cleared first, compared with
            the source; mismatches counted. Paced to A's progress, so that
            it copies through the whole run.
  --pause-thread N
            a third thread: N times, after a random wait (--pause-gap-ms, 200-1000
            ms, from a seeded RNG), vmmshim.pause() (everything, contents
            kept), held --pause-hold-ms (50-300 ms), then vmmshim.resume(); one line per cycle:
              pause cycle I: paused B in S s, resumed B in S s
            (with " (after the work ended)" when A and B had finished).

Both workers run a fixed number of steps (--steps; --copies, default the same
number), so the result does not depend on pauses, sleeps or timing.
Prints "ready PID" once the memory is made and the threads started, and at
the end
    result DIGEST copies N mismatches M
(DIGEST: a sha256 prefix of kv's bytes) to compare with a run nobody paused
(the same on one kind of GPU natively and under the shim), then a line
"elapsed ..." with the timings (not to compare) and, with --pause-thread,
"pause cycles N, K during the work". An exception in any thread: a message
naming the thread with its traceback on stderr, exit status 1; not finished
within --timeout seconds: every thread's stack on stderr, exit status 2.

    vmmshim run -- python3 examples/busy_workload.py [--steps 5000]
    LD_PRELOAD=build/libvmmshim.so PYTHONPATH=python python3 examples/busy_workload.py \\
        --pause-thread 20
    python3 examples/busy_workload.py          # natively (vmmshim.tag does nothing)

usage: busy_workload.py [--steps N] [--copies N] [--n N] [--copy-mib N]
           [--copy-interval-ms MS] [--sync-every N] [--pause-thread N]
           [--pause-seed S] [--seed S] [--device D] [--timeout S]
"""
import argparse
import contextlib
import faulthandler
import hashlib
import math
import os
import random
import sys
import threading
import time
import traceback

import torch

try:
    import vmmshim
    tag = vmmshim.tag
except ImportError:  # natively, without the package on the path
    vmmshim = None
    tag = lambda _name: contextlib.nullcontext()  # noqa: E731

# Step i adds h * ALPHAS[i % 4] into kv: the order of the steps matters.
ALPHAS = (1.0, 0.5, -0.75, 0.25)

_print_lock = threading.Lock()


def say(*parts, file=None):
    with _print_lock:
        print(*parts, file=file or sys.stdout, flush=True)


def digest(t):
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:16]


class Workers:
    def __init__(self, args):
        self.args = args
        self.device = torch.device("cuda", args.device)
        self.stop = threading.Event()  # set on the first failure: every thread ends
        self.errors = []               # (thread name, traceback text)
        self.errors_lock = threading.Lock()
        self.steps_done = 0            # thread A's enqueued steps (read by B's pacing)
        self.copies_done = 0
        self.mismatches = 0
        self.pause_lines = 0
        self.pauses_during_work = 0
        self.threads = []
        self.workers = []              # threads A and B

    def fail(self, name, text):
        with self.errors_lock:
            self.errors.append((name, text))
        self.stop.set()

    def setup(self):
        a = self.args
        torch.cuda.set_device(self.device)
        torch.manual_seed(a.seed)
        g = torch.Generator(device=self.device).manual_seed(a.seed)
        n = a.n
        self.w = (torch.randn(n, n, device=self.device, generator=g)
                  .mul_(1.0 / math.sqrt(n)).to(torch.bfloat16))
        with tag("kv"):
            self.kv = torch.randn(n, n, device=self.device, generator=g)
        # Thread B's host tensors: two patterns, each pinned and pageable, and
        # a pinned and a pageable destination.
        hg = torch.Generator(device="cpu").manual_seed(a.seed + 1)
        words = max(1, int(a.copy_mib * (1 << 20)) // 4)
        patterns = [torch.randint(-(1 << 31), (1 << 31) - 1, (words,), dtype=torch.int32,
                                  generator=hg) for _ in range(2)]
        self.sources = []
        for p in patterns:
            self.sources.append((p.pin_memory(), True))
            self.sources.append((p.clone(), False))
        self.dst = {True: torch.empty(words, dtype=torch.int32).pin_memory(),
                    False: torch.empty(words, dtype=torch.int32)}
        self.words = words
        torch.cuda.synchronize(self.device)

    # Thread A.
    def matmuls(self):
        a = self.args
        kv, w = self.kv, self.w
        for i in range(a.steps):
            if self.stop.is_set():
                return
            x = kv.sin().to(torch.bfloat16)   # fresh tensors through the allocator
            h = torch.mm(x, w)
            kv.add_(h, alpha=ALPHAS[i % len(ALPHAS)])
            del x, h
            self.steps_done = i + 1
            if (i + 1) % a.sync_every == 0:
                torch.cuda.current_stream().synchronize()
        torch.cuda.current_stream().synchronize()

    # Thread B.
    def copies(self):
        a = self.args
        stream = torch.cuda.Stream(device=self.device)
        interval = a.copy_interval_ms / 1000.0
        for i in range(a.copies):
            # Paced to A: copy i waits until A has done its share of the steps.
            want = (i * a.steps) // max(1, a.copies)
            while self.steps_done < want and not self.stop.is_set():
                time.sleep(0.001)
            if self.stop.is_set():
                return
            src, pinned = self.sources[i % len(self.sources)]
            dst = self.dst[pinned]
            dst.fill_(-1)  # a copy that did not happen cannot look right
            with torch.cuda.stream(stream):
                d = torch.empty(self.words, dtype=torch.int32, device=self.device)
                d.copy_(src, non_blocking=True)
                dst.copy_(d, non_blocking=True)
            stream.synchronize()
            del d
            if not torch.equal(dst, src):
                self.mismatches += 1
                if self.mismatches <= 5:
                    bad = int((dst != src).sum())
                    say(f"busy_workload: copy {i} ({'pinned' if pinned else 'pageable'}): "
                        f"{bad} of {self.words} words differ", file=sys.stderr)
            self.copies_done = i + 1
            time.sleep(interval)

    # Thread C (--pause-thread N).
    def pauses(self):
        a = self.args
        rng = random.Random(a.pause_seed)
        for i in range(1, a.pause_thread + 1):
            time.sleep(rng.uniform(*a.pause_gap_ms) / 1000)
            if self.stop.is_set():
                return
            busy = self.working()
            t0 = time.monotonic()
            paused = vmmshim.pause()
            t1 = time.monotonic()
            try:
                time.sleep(rng.uniform(*a.pause_hold_ms) / 1000)
            finally:
                t2 = time.monotonic()
                resumed = vmmshim.resume()
                t3 = time.monotonic()
            busy = busy and self.working()
            self.pause_lines += 1
            self.pauses_during_work += busy
            say(f"pause cycle {i}: paused {paused} in {t1 - t0:.3f} s, "
                f"resumed {resumed} in {t3 - t2:.3f} s"
                + ("" if busy else " (after the work ended)"))

    def working(self):
        """Whether thread A or B is still at work."""
        return any(t.is_alive() for t in self.workers)

    def start(self, name, fn):
        def body():
            try:
                torch.cuda.set_device(self.device)
                fn()
            except BaseException:  # noqa: B902: every failure is reported
                self.fail(name, traceback.format_exc())
        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        self.threads.append(t)
        return t


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5000, help="thread A's matmul steps")
    p.add_argument("--copies", type=int, default=None, help="thread B's copies (default: --steps)")
    p.add_argument("--n", type=int, default=8192, help="the matrices are N x N")
    p.add_argument("--copy-mib", type=float, default=4)
    p.add_argument("--copy-interval-ms", type=float, default=2)
    p.add_argument("--sync-every", type=int, default=8,
                   help="thread A waits for its stream every N steps (bounds the work queued)")
    p.add_argument("--pause-thread", type=int, default=0, metavar="N")
    p.add_argument("--pause-seed", type=int, default=1)
    ms_range = lambda v: tuple(float(x) for x in v.split(","))  # noqa: E731
    p.add_argument("--pause-gap-ms", type=ms_range, default=(200, 1000), metavar="LO,HI",
                   help="work between pauses, uniform in [LO, HI] ms")
    p.add_argument("--pause-hold-ms", type=ms_range, default=(50, 300), metavar="LO,HI",
                   help="how long each pause holds, uniform in [LO, HI] ms")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1200,
                   help="seconds before the run is given up as hung (exit status 2)")
    args = p.parse_args()
    if args.copies is None:
        args.copies = args.steps
    if args.pause_thread and vmmshim is None:
        p.error("--pause-thread needs the vmmshim package (PYTHONPATH=REPO/python)")

    w = Workers(args)

    def excepthook(hook_args):  # a thread not started by Workers.start
        w.fail(getattr(hook_args.thread, "name", "?"),
               "".join(traceback.format_exception(hook_args.exc_type, hook_args.exc_value,
                                                  hook_args.exc_traceback)))
    threading.excepthook = excepthook

    w.setup()
    start = time.monotonic()
    w.workers = [w.start("A (matmuls)", w.matmuls), w.start("B (copies)", w.copies)]
    pauser = w.start("C (pauses)", w.pauses) if args.pause_thread else None
    say("ready", os.getpid())

    deadline = start + args.timeout
    failed_at = None
    work_end = None
    while any(t.is_alive() for t in w.threads):
        next(t for t in w.threads if t.is_alive()).join(timeout=0.2)
        now = time.monotonic()
        if work_end is None and not w.working():
            work_end = now
        if w.stop.is_set():
            # The others end at their next step; one blocked in a CUDA call
            # (a pause never resumed) is given 30 s, then left behind.
            failed_at = failed_at or now
            if now - failed_at > 30:
                break
        if now > deadline:
            alive = [t.name for t in w.threads if t.is_alive()]
            say(f"busy_workload: FAILED: not finished after {args.timeout:.0f} s "
                f"(still running: {', '.join(alive)}; A at step {w.steps_done} of {args.steps}, "
                f"B at copy {w.copies_done} of {args.copies}); every thread's stack:",
                file=sys.stderr)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
            os._exit(2)
    work_seconds = (work_end or time.monotonic()) - start

    if w.errors:
        for name, text in w.errors:
            say(f"busy_workload: FAILED: an exception in thread {name}:\n{text}", file=sys.stderr)
        alive = [t.name for t in w.threads if t.is_alive()]
        if alive:
            say(f"busy_workload: threads still blocked: {', '.join(alive)}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # Threads may be stuck in CUDA calls: do not wait for them at exit.
        os._exit(1)

    torch.cuda.synchronize(w.device)
    say(f"result {digest(w.kv)} copies {w.copies_done} mismatches {w.mismatches}")
    say(f"elapsed {work_seconds:.2f} s: {args.steps} matmul steps of {args.n}x{args.n} "
        f"({1000 * work_seconds / max(1, args.steps):.3f} ms a step), {w.copies_done} copies "
        f"of {args.copy_mib:g} MiB")
    if pauser is not None:
        say(f"pause cycles {w.pause_lines}, {w.pauses_during_work} during the work")


if __name__ == "__main__":
    main()

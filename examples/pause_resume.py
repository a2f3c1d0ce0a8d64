"""Pause and resume of a PyTorch program's memory by tag (docs/pause-resume.md).

A model and a `kv` buffer (KV_GIB GiB, allocated under the tag "kv") live on
GPU 0. With --pause the program:
  1. pauses "kv" (contents kept in host memory); free device memory rises by
     its size, as cudaMemGetInfo and nvidia-smi see it;
  2. allocates something else in the freed memory, uses it and frees it;
  3. resumes "kv";
and then prints the same result line as a run that never paused (--backend
none): a checksum of kv and of the model's output. Measurements go to
standard error, one line each, prefixed "pause_resume:".

    LD_PRELOAD=libvmmshim.so python3 examples/pause_resume.py --backend vmmshim --pause
    python3 examples/pause_resume.py --backend none          # the reference result
    LD_PRELOAD=.../torch_memory_saver_hook_mode_preload_cu13.abi3.so \\
        python3 examples/pause_resume.py --backend tms --pause   # torch_memory_saver

--backend vmmshim finds the shim's C API in the process (ctypes); without the
shim it says so and exits 2.
"""
import argparse
import contextlib
import ctypes
import subprocess
import sys
import time

import torch

PAUSE_KEEP_CONTENTS = 1


def nvidia_smi_used_mib():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i",
             "0"], capture_output=True, text=True, timeout=30).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return -1


class VmmshimBackend:
    def __init__(self, keep):
        lib = ctypes.CDLL(None)
        try:
            self._set_tag = lib.vmmshim_set_allocation_tag
            self._pause = lib.vmmshim_pause_memory
            self._resume = lib.vmmshim_resume_memory
        except AttributeError:
            sys.exit("pause_resume: the vmmshim API is not in this process "
                     "(run it under LD_PRELOAD=libvmmshim.so)")
        self._set_tag.argtypes = [ctypes.c_char_p]
        self._pause.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_size_t)]
        self._resume.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
        self._keep = keep

    @contextlib.contextmanager
    def region(self, tag):
        self._set_tag(tag.encode())
        try:
            yield
        finally:
            self._set_tag(None)

    def pause(self, tag):
        n = ctypes.c_size_t(0)
        rc = self._pause(tag.encode(), PAUSE_KEEP_CONTENTS if self._keep else 0, ctypes.byref(n))
        if rc != 0:
            sys.exit(f"pause_resume: vmmshim_pause_memory({tag!r}) returned {rc}")
        return n.value

    def resume(self, tag):
        n = ctypes.c_size_t(0)
        rc = self._resume(tag.encode(), ctypes.byref(n))
        if rc != 0:
            sys.exit(f"pause_resume: vmmshim_resume_memory({tag!r}) returned {rc}")
        return n.value


class TmsBackend:
    """torch_memory_saver in preload mode (its library in LD_PRELOAD)."""

    def __init__(self, keep):
        from torch_memory_saver import torch_memory_saver
        torch_memory_saver.hook_mode = "preload"
        self._tms = torch_memory_saver
        self._keep = keep

    def region(self, tag):
        return self._tms.region(tag=tag, enable_cpu_backup=self._keep)

    def pause(self, tag):
        self._tms.pause(tag)
        return -1

    def resume(self, tag):
        self._tms.resume(tag)
        return -1


class NoBackend:
    def __init__(self, keep):
        pass

    def region(self, tag):
        return contextlib.nullcontext()


def checksum(t):
    """Exact: the 32-bit words of `t` summed as integers, in chunks."""
    words = t.view(torch.int32).view(-1)
    total = 0
    step = 1 << 26
    for i in range(0, words.numel(), step):
        total += int(words[i:i + step].to(torch.int64).sum().item())
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["vmmshim", "tms", "none"], required=True)
    parser.add_argument("--pause", action="store_true")
    parser.add_argument("--no-keep", action="store_true",
                        help="pause without keeping contents (the result then differs)")
    parser.add_argument("--kv-gib", type=float, default=8)
    parser.add_argument("--cycles", type=int, default=1,
                        help="pause and resume this many times (with --pause)")
    args = parser.parse_args()
    if args.pause and args.backend == "none":
        parser.error("--pause needs a backend")
    backend = {"vmmshim": VmmshimBackend, "tms": TmsBackend, "none": NoBackend}[args.backend](
        not args.no_keep)
    dev = torch.device("cuda", 0)
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 4096)).to(dev)
    x = torch.randn(512, 4096, device=dev)
    kv_bytes = int(args.kv_gib * (1 << 30)) // (2 << 20) * (2 << 20)
    with backend.region("kv"):
        kv = torch.empty(kv_bytes // 4, dtype=torch.float32, device=dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(99)
    kv.normal_(generator=gen)
    torch.cuda.synchronize()

    def report(step):
        free, total = torch.cuda.mem_get_info(0)
        print(f"pause_resume: {step}: cudaMemGetInfo free {free / 2**30:.2f} GiB, nvidia-smi "
              f"used {nvidia_smi_used_mib()} MiB", file=sys.stderr, flush=True)
        return free

    free_start = report("start")
    for cycle in range(1, args.cycles + 1 if args.pause else 1):
        # As an RL loop sleeps and wakes its engine, many times per process:
        # the first cycle carries one-time costs (vmmshim page-locks its
        # staging ring then), the later ones the steady state.
        t0 = time.perf_counter()
        released = backend.pause("kv")
        torch.cuda.synchronize()
        pause_s = time.perf_counter() - t0
        free_paused = report("paused")
        other = torch.empty(kv_bytes // 4, dtype=torch.float32, device=dev)  # in the freed memory
        other.fill_(3.0)
        other_sum = float(other.sum().item())
        del other
        torch.cuda.empty_cache()
        t0 = time.perf_counter()
        restored = backend.resume("kv")
        torch.cuda.synchronize()
        resume_s = time.perf_counter() - t0
        report("resumed")
        gib = kv_bytes / 2**30
        print(f"pause_resume: {args.backend} {'without' if args.no_keep else 'with'} contents"
              f"{f' (cycle {cycle})' if args.cycles > 1 else ''}: "
              f"pause {pause_s:.3f} s ({gib / pause_s:.1f} GiB/s), resume {resume_s:.3f} s "
              f"({gib / resume_s:.1f} GiB/s) of {gib:.2f} GiB; free memory rose by "
              f"{(free_paused - free_start) / 2**30:.2f} GiB; released {released} bytes, "
              f"restored {restored} bytes (-1: not reported); the other buffer summed "
              f"{other_sum:.0f}", file=sys.stderr, flush=True)
    y = model(x)
    print(f"pause_resume: result kv-checksum {checksum(kv)} model-output "
          f"{float(y.double().sum().item()):.6f}", flush=True)


if __name__ == "__main__":
    main()

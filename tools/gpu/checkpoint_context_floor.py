#!/usr/bin/env python3
"""What the driver's process checkpoint (cuCheckpointProcess*, as cuda-checkpoint
calls it) costs for a context that holds almost nothing else: the floor of a
deep sleep (docs/deep-sleep-design.md: the checkpoint of what is left after a pause), and
whether lowering the context's per-thread stack (cuCtxSetLimit
CU_LIMIT_STACK_SIZE, which sizes the local memory the driver reserves for every
resident thread of the GPU) before the checkpoint lowers it.

Natively (no shim), one process per run, made one way:
  ctx          cuInit, the primary context and a buffer of --keep-mib MiB
               (at least 2)
  ctx_stack    the same, the stack limit set to 0 before the checkpoint and
               back after the wake (timed)
  torch        PyTorch: a tensor of --keep-mib MiB kept, a matmul (cuBLAS) and a
               convolution (cuDNN) run, then the caching allocator emptied:
               what a PyTorch process holds after the shim paused its memory
  torch_stack  the same, the stack limit lowered and restored as ctx_stack
With --unpin-beside GIB, each run also starts a second process that page-locks
GIB of huge-page memory (cuMemHostRegister) and gives the pinning back
(cuMemHostUnregister) at the moment the checkpoint starts: whether unpinning
in another process overlaps the checkpoint (a helper process that owns a
sleep's page-locked copies), against the same unpinning alone before it.
Each run: the process's MiB on nvidia-smi and its stack limit, the driver's
lock + checkpoint, then restore + unlock (as tools/gpu/driver_checkpoint.py
makes them, from this process), timed; the kept buffer checked after the wake (and for torch a matmul against
the one before). The ways alternate, ROUNDS rounds.
usage: python3 tools/gpu/checkpoint_context_floor.py [--rounds 2] [--keep-mib 0]
       [--unpin-beside GIB] [--ways ctx,ctx_stack,torch,torch_stack]"""
import argparse
import ctypes
import os
import subprocess
import sys
import time

CU_LIMIT_STACK_SIZE = 0
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_host_memory import page_locked_huge_pages, primary_context  # noqa: E402
from driver_checkpoint import LockArgs  # noqa: E402


def check(rc, what):
    if rc != 0:
        sys.exit(f"checkpoint_context_floor: {what} failed: CUDA error {rc}")


def stack_limit(cu):
    value = ctypes.c_size_t()
    check(cu.cuCtxGetLimit(ctypes.byref(value), CU_LIMIT_STACK_SIZE), "cuCtxGetLimit")
    return value.value


def device_used(cu):
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return (total.value - free.value) >> 20


def child(way, keep_mib):
    cu = ctypes.CDLL("libcuda.so.1")
    if way.startswith("torch"):
        import torch
        keep = torch.full((keep_mib << 18,), 7.0, device="cuda")
        a = torch.randn(2048, 2048, device="cuda")
        before = (a @ a).sum().item()
        image = torch.randn(8, 64, 56, 56, device="cuda")
        conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
        conv(image).sum().item()
        del image, conv
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    else:
        primary_context(cu)
        device, size = ctypes.c_uint64(), ctypes.c_size_t(max(keep_mib, 2) << 20)
        check(cu.cuMemAlloc_v2(ctypes.byref(device), size), "cuMemAlloc")
        check(cu.cuMemsetD8_v2(device, ctypes.c_ubyte(0x5a), size), "cuMemsetD8")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    stack = stack_limit(cu)
    used = device_used(cu)
    lowered = ""
    if way.endswith("_stack"):
        start = time.perf_counter()
        check(cu.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(0)), "cuCtxSetLimit")
        lowered = (f" lowered to {stack_limit(cu)} B in {time.perf_counter() - start:.3f} s, "
                   f"cuMemGetInfo {used} -> {device_used(cu)} MiB")
    print(f"ready {os.getpid()} stack {stack} B{lowered}", flush=True)
    sys.stdin.readline()  # the parent's sleep and wake happen meanwhile
    restored = ""
    if way.endswith("_stack"):
        start = time.perf_counter()
        check(cu.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(stack)), "cuCtxSetLimit")
        restored = f" (stack back to {stack_limit(cu)} B in {time.perf_counter() - start:.3f} s)"
    if way.startswith("torch"):
        import torch
        intact = bool((keep == 7.0).all().item()) and (a @ a).sum().item() == before
    else:
        probe = (ctypes.c_ubyte * 16)()
        check(cu.cuMemcpyDtoH_v2(probe, device, ctypes.c_size_t(16)), "cuMemcpyDtoH")
        intact = all(b == 0x5a for b in probe)
    print(("intact" if intact else "DIFFERS") + restored, flush=True)


def holder(gib):
    """Page-locks gib GiB, then unpins it when told and prints the seconds."""
    cu = ctypes.CDLL("libcuda.so.1")
    primary_context(cu)
    host = page_locked_huge_pages(cu, ctypes.CDLL(None), int(gib * (1 << 30)))
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    check(cu.cuMemHostUnregister(ctypes.c_void_p(host)), "cuMemHostUnregister")
    print(f"{time.perf_counter() - start:.3f}", flush=True)
    sys.stdin.readline()


def start_holder(gib):
    h = subprocess.Popen([sys.executable, __file__, "--holder", str(gib)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if h.stdout.readline().strip() != "ready":
        sys.exit("checkpoint_context_floor: the page-locking process did not start")
    return h


def unpin(h):
    h.stdin.write("go\n")
    h.stdin.flush()


def unpinned(h):
    seconds = h.stdout.readline().strip()
    h.stdin.write("end\n")
    h.stdin.flush()
    h.wait(timeout=120)
    return seconds


def held(pid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if fields and fields[0] == str(pid):
            return fields[1]
    return "0"


def driver_calls(cu, pid, *names):
    """The driver's checkpoint calls on pid, as cuda-checkpoint makes them; the
    seconds they took, or why they failed."""
    calls = {"lock": lambda: cu.cuCheckpointProcessLock(pid, ctypes.byref(LockArgs(10000))),
             "checkpoint": lambda: cu.cuCheckpointProcessCheckpoint(pid, None),
             "restore": lambda: cu.cuCheckpointProcessRestore(pid, None),
             "unlock": lambda: cu.cuCheckpointProcessUnlock(pid, None)}
    start = time.perf_counter()
    for name in names:
        rc = calls[name]()
        if rc != 0:
            return f"failed ({name}: CUDA error {rc})"
    return f"{time.perf_counter() - start:.3f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep-mib", type=int, default=0)
    parser.add_argument("--unpin-beside", type=float, default=0)
    parser.add_argument("--holder", type=float)
    parser.add_argument("--ways", default="ctx,ctx_stack,torch,torch_stack")
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.keep_mib)
    if args.holder:
        return holder(args.holder)
    cu = ctypes.CDLL("libcuda.so.1")
    check(cu.cuInit(0), "cuInit")  # no context: this process only calls the checkpoint API
    failed = 0
    for rnd in range(1, args.rounds + 1):
        for way in args.ways.split(","):
            p = subprocess.Popen([sys.executable, __file__, "--child", way,
                                  "--keep-mib", str(args.keep_mib)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline().strip()
            if not line.startswith("ready"):
                print(f"{way} keep {args.keep_mib} MiB round {rnd}: did not start", flush=True)
                failed += 1
                p.kill()
                continue
            pid = int(line.split()[1])
            mib = held(pid)
            beside = ""
            if args.unpin_beside:
                h = start_holder(args.unpin_beside)
                unpin(h)
                beside = f"; {args.unpin_beside:g} GiB unpinned alone in {unpinned(h)} s"
                h = start_holder(args.unpin_beside)
            if args.unpin_beside:
                unpin(h)
            times = [driver_calls(cu, pid, "lock", "checkpoint")]
            asleep = held(pid)
            if args.unpin_beside:
                beside += f", beside the checkpoint in {unpinned(h)} s"
            times.append(driver_calls(cu, pid, "restore", "unlock"))
            p.stdin.write("go\n")
            p.stdin.flush()
            result = p.stdout.readline().strip()
            p.wait(timeout=120)
            failed += not result.startswith("intact")
            print(f"{way} keep {args.keep_mib} MiB round {rnd}: {mib} MiB on nvidia-smi, {asleep} asleep; "
                  f"{' '.join(line.split()[2:])}; checkpoint {times[0]} s, restore {times[1]} s; "
                  f"{result}{beside}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Put everything a PyTorch process holds on its GPU to sleep and wake it up,
as an RL trainer does with its inference engine (docs/pause-resume.md), and
check that every result after the wake-up equals a run that never slept.

The process holds what such an engine holds:
  weights   a model's parameters and its input (kept: paused with contents)
  kv        a KV cache of --kv-gib GiB (dropped: paused without contents)
  graph     a captured CUDA graph of the model, whose private memory pool
            holds its intermediate and output tensors (kept), replayed after
            the wake-up
  cuBLAS    its workspace (allocated by PyTorch at the first matmul)
  NCCL      a one-rank process group after an all-reduce (its buffers, made
            by NCCL with cuMemCreate/cuMemMap, or by cudaMalloc)

Backends (--backend):
  vmmshim   under LD_PRELOAD=libvmmshim.so: everything but "kv" paused with
            contents (vmmshim.pause(except_tags=["kv"])), then "kv" without;
            resume of everything
  tms       torch_memory_saver 0.0.10 in preload mode, with its own API:
            region(tag, enable_cpu_backup) and cuda_graph(...); cuBLAS and
            NCCL are outside its regions, as its users have them
  none      native, no pause: the reference

Prints one "result" line (hashes of the eager output, the graph replay, the
all-reduce and the refilled cache; equal across backends when nothing was
lost) and "sleep_whole_process:" measurement lines on standard error: the
process's memory as nvidia-smi sees it after CUDA started, with everything
allocated, after the pause and after the resume (native: after everything
was freed, the floor a pause can reach); the pause and resume times; for
vmmshim the residency report after the pause.

    LD_PRELOAD=build/libvmmshim.so PYTHONPATH=python \\
        python3 examples/sleep_whole_process.py --backend vmmshim
"""
import argparse
import contextlib
import hashlib
import json
import os
import sys
import time

from process_memory import smi_used_mib

GIB = 1 << 30
MIB = 1 << 20


def log(msg):
    print(f"sleep_whole_process: {msg}", file=sys.stderr, flush=True)


class Vmmshim:
    def __init__(self):
        import vmmshim
        if not vmmshim.loaded():
            sys.exit("sleep_whole_process: run it under LD_PRELOAD=libvmmshim.so")
        self.v = vmmshim

    def region(self, tag, keep):
        return self.v.tag(tag)

    def graph(self, torch, g, pool):
        @contextlib.contextmanager
        def capture():
            with self.v.tag("graph"), torch.cuda.graph(g, pool=pool):
                yield
        return capture()

    def pause(self):
        kept = self.v.pause(except_tags=["kv"], keep_contents=True)
        dropped = self.v.pause("kv", keep_contents=False)
        return f"{kept} bytes with contents, {dropped} without"

    def resume(self):
        return f"{self.v.resume()} bytes"

    def after_pause(self):
        for d in self.v.residency()["devices"]:
            log("residency: " + json.dumps(d, separators=(",", ":")))


class Tms:
    def __init__(self):
        from torch_memory_saver import torch_memory_saver
        torch_memory_saver.hook_mode = "preload"
        self.t = torch_memory_saver

    def region(self, tag, keep):
        return self.t.region(tag=tag, enable_cpu_backup=keep)

    def graph(self, torch, g, pool):
        return self.t.cuda_graph(g, pool=pool, tag="graph", enable_cpu_backup=True)

    def pause(self):
        self.t.pause(None)
        return "all tags"

    def resume(self):
        self.t.resume(None)
        return "all tags"

    def after_pause(self):
        pass


class Native:
    def region(self, tag, keep):
        return contextlib.nullcontext()

    def graph(self, torch, g, pool):
        return torch.cuda.graph(g, pool=pool)


def digest(t):
    return hashlib.sha256(t.detach().cpu().numpy().tobytes()).hexdigest()[:12]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["vmmshim", "tms", "none"], required=True)
    ap.add_argument("--kv-gib", type=float, default=16)
    ap.add_argument("--work-gib", type=float, default=16,
                    help="a phase of this many GiB while asleep (what the trainer does)")
    args = ap.parse_args()
    backend = {"vmmshim": Vmmshim, "tms": Tms, "none": Native}[args.backend]()

    import torch
    import torch.distributed as dist
    torch.cuda.init()
    torch.empty(1, device="cuda")
    log(f"{args.backend}: CUDA started: nvidia-smi {smi_used_mib()} MiB")

    g = torch.Generator(device="cpu").manual_seed(7)
    with backend.region("weights", True):
        w = [torch.randn(4096, 4096, generator=g).cuda() for _ in range(8)]
        x = torch.randn(256, 4096, generator=g).cuda()
    with backend.region("kv", False):
        kv = torch.empty(int(args.kv_gib * GIB) // 2, dtype=torch.float16, device="cuda")
    kv.fill_(1.0)

    def model(inp):
        h = inp
        for m in w:
            h = torch.tanh(h @ m)  # cuBLAS: its workspace comes with the first one
        return h

    eager = model(x)
    # A captured graph of the model in its own private pool (warmed up on a
    # side stream first, as torch.cuda.graph's documentation asks).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    with backend.graph(torch, graph, pool):
        static_out = model(x)
    graph.replay()
    torch.cuda.synchronize()
    graph_before = digest(static_out)

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl", rank=0, world_size=1,
                            device_id=torch.device("cuda", torch.cuda.current_device()))
    r = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    dist.all_reduce(r)
    torch.cuda.synchronize()
    reduce_before = digest(r)
    log(f"{args.backend}: everything allocated: nvidia-smi {smi_used_mib()} MiB "
        f"(PyTorch reserved {torch.cuda.memory_reserved() // MIB} MiB)")

    if args.backend != "none":
        t0 = time.perf_counter()
        what = backend.pause()
        t1 = time.perf_counter()
        log(f"{args.backend}: paused: {what} in {t1 - t0:.3f} s: nvidia-smi {smi_used_mib()} MiB")
        backend.after_pause()
        # The trainer's phase: memory the sleeping engine gave up.
        a = torch.ones(int(args.work_gib * GIB) // 4, dtype=torch.float32, device="cuda")
        work = float(a.sum())
        del a
        torch.cuda.synchronize()
        log(f"{args.backend}: a phase of {args.work_gib} GiB while asleep: sum {work:.0f}")
        t0 = time.perf_counter()
        what = backend.resume()
        t1 = time.perf_counter()
        log(f"{args.backend}: resumed: {what} in {t1 - t0:.3f} s: nvidia-smi {smi_used_mib()} MiB")

    graph.replay()
    again = model(x)
    dist.all_reduce(r)  # a second all-reduce of one rank leaves r as it was
    kv.fill_(2.0)  # the dropped cache is refilled
    torch.cuda.synchronize()
    ok = digest(static_out) == graph_before and digest(again) == digest(eager)
    print(f"result: eager {digest(eager)} again {digest(again)} graph {graph_before} replay "
          f"{digest(static_out)} all_reduce {reduce_before} again {digest(r)} kv "
          f"{float(kv[:1024].float().sum()):.0f}")
    dist.destroy_process_group()
    if args.backend == "none":
        # What the process holds with every allocation freed: the context,
        # the modules its kernels loaded (PyTorch's, cuBLAS's, NCCL's) and
        # the driver's own state; the floor a pause can reach.
        del w, x, kv, eager, again, static_out, graph, r
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        log(f"{args.backend}: everything freed: nvidia-smi {smi_used_mib()} MiB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

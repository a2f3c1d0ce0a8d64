"""How fast a pause and resume with contents move a PyTorch process's memory
to host memory and back, under vmmshim's settings (CONFIGS: host, paused
memory stays addressable in host VMM memory made by the first pause and kept
for the next, core/heap/host_mapped_pool.h; host-background, the same with
that memory made in the background instead of on the first pause's path (the
cycles wait, untimed, until it is made); default, no setting, which is
host-background; fault, nothing mapped and copies through
pageable memory, or through the pinned pool with VMMSHIM_PINNED_POOL),
beside the copy engine's own speed for the same bytes
through page-locked memory made beforehand (the "native" column: what no
pause can beat).

Workloads (each in a process of its own, started under the shim):
  tensor     one tensor of --gib GiB (default 16)
  mixed      what a trainer holds: weights in 64 MiB tensors, Adam's two
             states for them, a KV cache, and a captured CUDA graph's private
             pool; --gib GiB in all (PyTorch's caching allocator)
  mixed-async       the same under backend:cudaMallocAsync
  mixed-expandable  the same under expandable_segments:True (PyTorch's own
                    VMM memory in 20 MiB pages, paused by the shim as another
                    library's memory)
Each process: the native copy out and back (after a warm-up copy), then
CYCLES pause/resume cycles of everything with contents (vmmshim.pause(),
vmmshim.resume()), the first reported apart (it is what a program that
pauses once sees), then a check that every tensor holds what it held.
The configurations alternate, ROUNDS rounds. GiB/s = the tensors' bytes
(2^30) per second of the whole call. Under each process's line, the shim's
own account of its last pause and resume (where the time went: host memory,
copies, unmaps, host mappings).

Prints one line per process:
  workload config round: native out/in GiB/s | first pause/resume GiB/s | later pause/resume GiB/s | intact
usage (on a GPU host, from the repository root, after tools/gpu/bundle.sh):
  python3 bench/pause_bandwidth.py --shim build/libvmmshim.so [--rounds 2] [--gib 16]
      [--pool-gib 20] [--workloads tensor,mixed,...] [--configs default,fault,...]"""
import argparse
import os
import subprocess
import sys
import time

WORKLOADS = {"tensor": "", "mixed": "", "mixed-async": "backend:cudaMallocAsync",
             "mixed-expandable": "expandable_segments:True"}
# The shim's settings compared (POOL: VMMSHIM_PINNED_POOL of --pool-gib).
# default: no setting (host, its host memory made in the background).
CONFIGS = {"default": {},
           "host": {"VMMSHIM_PAUSED_ACCESS": "host", "VMMSHIM_HOST_POOL_MAKE": "pause"},
           "host-background": {"VMMSHIM_PAUSED_ACCESS": "host",
                               "VMMSHIM_HOST_POOL_MAKE": "background"},
           "fault": {"VMMSHIM_PAUSED_ACCESS": "fault"},
           "fault-pool": {"VMMSHIM_PAUSED_ACCESS": "fault", "VMMSHIM_PINNED_POOL": "POOL"}}


def gibps(nbytes, seconds):
    return nbytes / (1 << 30) / seconds


def child(workload, gib, cycles):
    import torch
    import vmmshim
    torch.cuda.init()
    gib_bytes = int(gib * (1 << 30))
    g = torch.Generator(device="cuda").manual_seed(7)
    tensors = []
    if workload == "tensor":
        tensors.append(torch.empty(gib_bytes // 4, device="cuda").uniform_(generator=g))
    else:
        # A quarter weights (64 MiB tensors), half Adam's states, the rest KV.
        part = 64 << 20
        weights = [torch.randn(part // 4, device="cuda", generator=g)
                   for _ in range(max(1, gib_bytes // 4 // part))]
        states = [torch.randn_like(w) for w in weights for _ in range(2)]
        kv_bytes = max(part, gib_bytes - sum(t.nbytes for t in weights + states) - (512 << 20))
        kv = torch.empty(kv_bytes // 2, dtype=torch.bfloat16, device="cuda").uniform_(
            generator=g)
        # A captured graph of a few matmuls: its private pool holds the outputs.
        x = torch.randn(4096, 4096, device="cuda", generator=g)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                y = x
                for _ in range(8):
                    y = torch.tanh(y @ x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x
            outs = []
            for _ in range(8):
                y = torch.tanh(y @ x)
                outs.append(y)
        graph.replay()
        tensors = weights + states + [kv, x] + outs
    torch.cuda.synchronize()
    nbytes = sum(t.nbytes for t in tensors)
    sums = [float(t.float().sum()) for t in tensors]
    torch.cuda.empty_cache()  # what is paused is the tensors, not PyTorch's free cache
    # Native: the same tensors' bytes through page-locked memory made
    # beforehand, in parts of at most 1 GiB (one buffer, reused: pinning
    # 16 GiB more would take 8 s a process and change nothing of the copy).
    part = 1 << 30
    buffer = torch.empty(part, dtype=torch.uint8, pin_memory=True)
    flat = [t.view(-1).view(torch.uint8) for t in tensors]

    def parts():
        for f in flat:
            for i in range(0, f.numel(), part):
                yield f[i:i + part]

    def timed(fn):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def out():
        for p in parts():
            buffer[:p.numel()].copy_(p, non_blocking=True)

    def back():
        # Into a scratch tensor: the tensors keep their contents for the check.
        scratch = torch.empty(part, dtype=torch.uint8, device="cuda")
        for p in parts():
            scratch[:p.numel()].copy_(buffer[:p.numel()], non_blocking=True)

    timed(out), timed(back)  # warm-up
    native = (timed(out), timed(back))
    del buffer
    torch.cuda.empty_cache()
    def settle():
        """Waits (at most 60 s, not timed) until no host memory is being made
        in the background (VMMSHIM_HOST_POOL_MAKE=background): a program's
        next pause comes after a step's work, seconds later."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pools = (vmmshim.residency() or {}).get("host_memory_for_pauses", [])
            if not any(p.get("queued_bytes", 0) for p in pools):
                return
            time.sleep(0.05)

    times = []
    for _ in range(cycles):
        p = timed(lambda: vmmshim.pause())
        r = timed(lambda: vmmshim.resume())
        times.append((p, r))
        settle()
    intact = [float(t.float().sum()) for t in tensors] == sums
    first = times[0]
    later = times[1:] or times
    fmt = lambda pair: f"{gibps(nbytes, pair[0]):.1f}/{gibps(nbytes, pair[1]):.1f}"  # noqa: E731
    later_pause = min(gibps(nbytes, p) for p, _ in later)
    later_resume = min(gibps(nbytes, r) for _, r in later)
    print(f"{nbytes / (1 << 30):.2f} GiB | native {fmt(native)} | first {fmt(first)} "
          f"({first[0]:.3f} s / {first[1]:.3f} s) | later (slowest) "
          f"{later_pause:.1f}/{later_resume:.1f} | {'intact' if intact else 'DIFFERS'}",
          flush=True)
    return 0 if intact else 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=list(WORKLOADS))
    parser.add_argument("--shim", default="build/libvmmshim.so")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--gib", type=float, default=16)
    parser.add_argument("--pool-gib", type=float, default=20)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--configs", default="default,fault")
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.gib, args.cycles)
    failed = 0
    for workload in args.workloads.split(","):
        for rnd in range(1, args.rounds + 1):
            for config in args.configs.split(","):
                env = dict(os.environ, LD_PRELOAD=os.path.abspath(args.shim),
                           PYTHONUNBUFFERED="1", VMMSHIM_LOG_LEVEL="info")
                env["PYTHONPATH"] = os.pathsep.join(
                    [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")]
                    + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
                if WORKLOADS[workload]:
                    env["PYTORCH_CUDA_ALLOC_CONF"] = WORKLOADS[workload]
                for name in ("VMMSHIM_PINNED_POOL", "VMMSHIM_PAUSED_ACCESS", "VMMSHIM_HOST_POOL_MAKE"):
                    env.pop(name, None)
                for name, value in CONFIGS[config].items():
                    env[name] = f"{int(args.pool_gib * 1024)}M" if value == "POOL" else value
                r = subprocess.run([sys.executable, __file__, "--child", workload, "--gib",
                                    str(args.gib), "--cycles", str(args.cycles)],
                                   env=env, capture_output=True, text=True, timeout=600)
                line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
                print(f"{workload} {config} round {rnd}: {line or 'FAILED'}", flush=True)
                accounts = [l for l in r.stderr.splitlines()
                            if "_memory(every allocation): " in l and " bytes in " in l]
                for account in accounts[-2:]:
                    print(f"    {account.split('] ', 1)[-1]}", flush=True)
                if r.returncode != 0:
                    failed += 1
                    sys.stderr.write(r.stderr[-3000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

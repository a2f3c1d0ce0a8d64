"""Ordinary work while memory is paused, with the framework's own allocator:
PyTorch (its caching allocator, `expandable_segments:True` or
`backend:cudaMallocAsync`, as PYTORCH_CUDA_ALLOC_CONF says) or CuPy (its
default memory pool). Each result equals a run that never paused.

The program tags memory as the README shows, leaves free blocks inside every
pool (the space a framework hands out again), then runs cycles. A cycle
pauses a selection (with or without contents):
  tag      vmmshim.pause("kv")
  all      vmmshim.pause()
  except   vmmshim.pause(except_tags=["weights"]), from another thread
and, while paused, allocates (small and large tensors, some freed again),
computes (matmuls through cuBLAS, reductions), captures and replays a CUDA
graph and runs a one-rank NCCL all-reduce (PyTorch), and runs a phase larger
than the memory that was free before the pause; then resumes everything and
checks what was kept (or refills what was dropped, as an engine reloads its
weights and refills its cache) and recomputes with it.

    vmmshim run -- python3 examples/safe_pause.py --framework torch
    python3 examples/safe_pause.py --framework torch --no-pause   # the reference

Prints one "result" line per cycle (equal to the reference's when nothing
went wrong) and "measure" lines (bytes and seconds; not compared).
Options: --cycles tag:keep,all:drop,... (default: all six), --kv-gib,
--untagged-gib, --phase-gib (default: sized from the device's memory so that
it exceeds what is free before every pause).
"""
import argparse
import hashlib
import os
import sys
import threading
import time

GIB = 1 << 30
MIB = 1 << 20
PHASE_CHUNK = 1 << 29  # int64 elements: 4 GiB
CYCLES = ["tag:keep", "tag:drop", "all:keep", "all:drop", "except:keep", "except:drop"]


def measure(msg):
    print(f"measure {msg}", flush=True)


def on_another_thread(fn):
    """fn() on a thread of its own (the pause and resume of the "except"
    cycles: a pause may come from any thread)."""
    box = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join()
    if not box:
        raise RuntimeError("safe_pause: the pausing thread failed")
    return box[0]


def pause(vmmshim, selection, keep):
    if selection == "tag":
        return vmmshim.pause("kv", keep_contents=keep)
    if selection == "all":
        return vmmshim.pause(keep_contents=keep)
    return on_another_thread(lambda: vmmshim.pause(except_tags=["weights"], keep_contents=keep))


def phase_sum(n):
    """sum(i % 1000 for i in range(n)), the phase's expected result."""
    full, rest = divmod(n, 1000)
    return full * 499500 + rest * (rest - 1) // 2


class Torch:
    """The PyTorch program's pieces."""

    def __init__(self, args):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.args = torch, dist, args
        torch.cuda.init()
        torch.empty(1, device="cuda")

    def fingerprint(self, t):
        """An exact fingerprint of a tensor, computed on the device: a hash
        of a strided sample and the int64 sum of all its 32-bit words."""
        torch = self.torch
        flat = t.detach().reshape(-1).view(torch.int32)
        step = max(1, flat.numel() // (1 << 18))
        sample = hashlib.sha256(flat[::step].cpu().numpy().tobytes()).hexdigest()[:10]
        total = 0
        for chunk in flat.split(1 << 26):
            total += int(chunk.to(torch.int64).sum())
        return f"{sample}/{total}"

    def setup(self):
        torch, vmmshim, a = self.torch, self.vmmshim, self.args
        g = torch.Generator(device="cpu").manual_seed(7)
        self.host_weights = [torch.randn(2048, 2048, generator=g) for _ in range(16)]  # 256 MiB
        self.host_bias = [torch.randn(2048, generator=g) for _ in range(16)]
        self.host_x = torch.randn(512, 2048, generator=g)
        with vmmshim.tag("weights"):
            self.w = [h.cuda() for h in self.host_weights]
            self.b = [h.cuda() for h in self.host_bias]  # small tensors
            self.x = self.host_x.cuda()
        with vmmshim.tag("kv"):
            self.kv = torch.empty(int(a.kv_gib * GIB) // 4, dtype=torch.float32, device="cuda")
            holes = [torch.empty(n * 4096, device="cuda") for n in range(1, 64)]
        self.fill_kv()
        self.state = torch.empty(int(a.untagged_gib * GIB) // 4, dtype=torch.float32,
                                 device="cuda")
        self.fill_state()
        smalls = [torch.empty(n * 1024, device="cuda") for n in range(1, 256)]
        # Free blocks inside every pool: what the allocator hands out again.
        del holes, smalls[::2]
        self.smalls = smalls
        self.eager = self.model(self.x)
        # A graph captured before the pause, in its own tag.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.model(self.x)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with vmmshim.tag("graph"), torch.cuda.graph(self.graph):
            self.static_out = self.model(self.x)
        self.graph.replay()
        self.init_nccl()
        torch.cuda.synchronize()
        self.reference = (self.fingerprint(self.eager), self.fingerprint(self.static_out))

    def init_nccl(self):
        torch, dist = self.torch, self.dist
        self.groups = getattr(self, "groups", 0) + 1  # a fresh store for each group
        store = f"/tmp/safe_pause.{os.getpid()}.{self.groups}"
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1,
                                device_id=torch.device("cuda", torch.cuda.current_device()))
        r = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(r)

    def fill_kv(self):
        torch = self.torch
        self.kv.fill_(0.5)
        self.kv[: 1 << 20].copy_(torch.arange(1 << 20, device="cuda", dtype=torch.float32))

    def fill_state(self):
        self.state.fill_(0.25)
        self.state[: 1 << 20].uniform_(generator=self.torch.Generator(device="cuda").manual_seed(3))

    def model(self, inp):
        h = inp
        for m, b in zip(self.w, self.b):
            h = self.torch.tanh(h @ m + b)
        return h

    def free_bytes(self):
        return self.torch.cuda.mem_get_info()[0]

    def total_bytes(self):
        return self.torch.cuda.mem_get_info()[1]

    def while_paused(self, selection, n_phase, native):
        """The work done while paused; a dict of results."""
        torch, dist = self.torch, self.dist
        out = {}
        gen = torch.Generator(device="cuda").manual_seed(11)
        # Allocations of many sizes, some freed again, from the default pool.
        sums = [float(torch.ones(1000, device="cuda").sum()),
                float(torch.empty(1000, device="cuda").fill_(7.0).sum())]
        keep = []
        for i in range(200):
            t = torch.empty((i * 7919) % (1 << 21) + 1, device="cuda").fill_(i % 13)
            sums.append(float(t.sum()))
            if i % 3 == 0:
                keep.append(t)
        out["alloc"] = hashlib.sha256(repr(sums).encode()).hexdigest()[:10]
        # Compute: cuBLAS matmuls on fresh tensors.
        a = torch.randn(1024, 1024, device="cuda", generator=gen)
        c = torch.randn(1024, 1024, device="cuda", generator=gen)
        out["compute"] = self.fingerprint(torch.relu(a @ c) @ c.T)
        # A CUDA graph captured and replayed while paused.
        static_in = torch.randn(256, 1024, device="cuda", generator=gen)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            (static_in @ c).relu().sum(0)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = (static_in @ c).relu().sum(0)
        replays = []
        for k in range(3):
            static_in.copy_(torch.randn(256, 1024, device="cuda", generator=gen))
            g.replay()
            replays.append(self.fingerprint(static_out))
        out["graph"] = hashlib.sha256(repr(replays).encode()).hexdigest()[:10]
        if selection == "tag":  # the graph captured before: its memory is not paused
            self.graph.replay()
            out["old_graph"] = self.fingerprint(self.static_out)
        # A one-rank NCCL all-reduce.
        r = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        dist.all_reduce(r)
        out["allreduce"] = self.fingerprint(r)
        del g, static_in, static_out, keep, a, c, r
        # The phase: more memory than was free before the pause, held at
        # once (natively, where it cannot be, chunk by chunk); chunks of at
        # most 2^29 elements, as PyTorch's kernels count elements in 32 bits
        # in places (a single 17-billion-element arange summed only 2^32).
        held, total = [], 0
        for start in range(0, n_phase, PHASE_CHUNK):
            chunk = torch.empty(min(PHASE_CHUNK, n_phase - start), dtype=torch.int64,
                                device="cuda")
            torch.arange(start, start + chunk.numel(), out=chunk)
            total += int(chunk.remainder_(1000).sum())
            if not native:
                held.append(chunk)
            del chunk
        del held
        out["phase"] = "ok" if total == phase_sum(n_phase) else f"WRONG {total}"
        torch.cuda.synchronize()
        return out

    def after_resume(self, selection, keep):
        """What was kept equals what was there; what was dropped is refilled."""
        out = {}
        dropped_weights = not keep and selection == "all"
        dropped_state = not keep and selection in ("all", "except")
        dropped_kv = not keep
        if dropped_weights:
            for d, h in zip(self.w + self.b + [self.x],
                            self.host_weights + self.host_bias + [self.host_x]):
                d.copy_(h)
        if dropped_kv:
            self.fill_kv()
        if dropped_state:
            self.fill_state()
        if dropped_state or dropped_weights:
            # NCCL's own memory was dropped with everything else: a program
            # that drops it makes its communicator again.
            self.dist.destroy_process_group()
            self.init_nccl()
        out["kv"] = self.fingerprint(self.kv)
        out["state"] = self.fingerprint(self.state)
        out["model"] = self.fingerprint(self.model(self.x))
        self.graph.replay()
        out["graph_replay"] = self.fingerprint(self.static_out)
        out["same_as_before"] = (out["model"], out["graph_replay"]) == self.reference
        r = self.torch.ones(1 << 20, device="cuda")
        self.dist.all_reduce(r)
        out["allreduce"] = self.fingerprint(r)
        return out

    def finish(self):
        self.dist.destroy_process_group()
        for n in range(1, self.groups + 1):
            try:
                os.unlink(f"/tmp/safe_pause.{os.getpid()}.{n}")
            except OSError:
                pass


class Cupy:
    """The CuPy program's pieces (no graph or NCCL: CuPy's default pool is
    the subject)."""

    def __init__(self, args):
        import cupy
        self.cp, self.args = cupy, args
        cupy.cuda.Device(0).use()
        cupy.empty(1)

    def fingerprint(self, t):
        cp = self.cp
        flat = t.reshape(-1).view(cp.int32)
        step = max(1, flat.size // (1 << 18))
        sample = hashlib.sha256(cp.asnumpy(flat[::step]).tobytes()).hexdigest()[:10]
        total = 0
        for s in range(0, flat.size, 1 << 26):
            total += int(flat[s:s + (1 << 26)].astype(cp.int64).sum())
        return f"{sample}/{total}"

    def setup(self):
        cp, vmmshim, a = self.cp, self.vmmshim, self.args
        rs = cp.random.RandomState(7)
        self.host_weights = [cp.asnumpy(rs.standard_normal((2048, 2048), dtype=cp.float32))
                             for _ in range(16)]
        self.host_x = cp.asnumpy(rs.standard_normal((512, 2048), dtype=cp.float32))
        with vmmshim.tag("weights"):
            self.w = [cp.asarray(h) for h in self.host_weights]
            self.x = cp.asarray(self.host_x)
        with vmmshim.tag("kv"):
            self.kv = cp.empty(int(a.kv_gib * GIB) // 4, dtype=cp.float32)
            holes = [cp.empty(n * 4096, dtype=cp.float32) for n in range(1, 64)]
        self.fill_kv()
        self.state = cp.empty(int(a.untagged_gib * GIB) // 4, dtype=cp.float32)
        self.fill_state()
        smalls = [cp.empty(n * 1024, dtype=cp.float32) for n in range(1, 256)]
        del holes, smalls[::2]
        self.smalls = smalls
        cp.cuda.Device().synchronize()
        self.reference = self.fingerprint(self.model(self.x))

    def fill_kv(self):
        self.kv.fill(0.5)
        self.kv[: 1 << 20] = self.cp.arange(1 << 20, dtype=self.cp.float32)

    def fill_state(self):
        self.state.fill(0.25)
        self.state[: 1 << 20] = self.cp.random.RandomState(3).random_sample(
            1 << 20, dtype=self.cp.float32)

    def model(self, inp):
        h = inp
        for m in self.w:
            h = self.cp.tanh(h @ m)
        return h

    def free_bytes(self):
        return self.cp.cuda.runtime.memGetInfo()[0]

    def total_bytes(self):
        return self.cp.cuda.runtime.memGetInfo()[1]

    def while_paused(self, selection, n_phase, native):
        cp = self.cp
        out = {}
        rs = cp.random.RandomState(11)
        sums = [float(cp.ones(1000, dtype=cp.float32).sum()),
                float(cp.full(1000, 7.0, dtype=cp.float32).sum())]
        keep = []
        for i in range(200):
            t = cp.full((i * 7919) % (1 << 21) + 1, i % 13, dtype=cp.float32)
            sums.append(float(t.sum()))
            if i % 3 == 0:
                keep.append(t)
        out["alloc"] = hashlib.sha256(repr(sums).encode()).hexdigest()[:10]
        a = rs.standard_normal((1024, 1024), dtype=cp.float32)
        c = rs.standard_normal((1024, 1024), dtype=cp.float32)
        out["compute"] = self.fingerprint(cp.maximum(a @ c, 0) @ c.T)
        del keep, a, c
        held, total = [], 0
        for start in range(0, n_phase, PHASE_CHUNK):
            chunk = cp.arange(start, min(n_phase, start + PHASE_CHUNK), dtype=cp.int64)
            cp.remainder(chunk, 1000, out=chunk)
            total += int(chunk.sum())
            if not native:
                held.append(chunk)
            del chunk
        del held
        out["phase"] = "ok" if total == phase_sum(n_phase) else f"WRONG {total}"
        cp.cuda.Device().synchronize()
        return out

    def after_resume(self, selection, keep):
        out = {}
        if not keep and selection == "all":
            for d, h in zip(self.w + [self.x], self.host_weights + [self.host_x]):
                d.set(h)
        if not keep:
            self.fill_kv()
        if not keep and selection in ("all", "except"):
            self.fill_state()
        out["kv"] = self.fingerprint(self.kv)
        out["state"] = self.fingerprint(self.state)
        out["model"] = self.fingerprint(self.model(self.x))
        out["same_as_before"] = out["model"] == self.reference
        return out

    def finish(self):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--framework", choices=["torch", "cupy"], required=True)
    ap.add_argument("--no-pause", action="store_true", help="the reference: never pause")
    ap.add_argument("--cycles", default=",".join(CYCLES))
    ap.add_argument("--kv-gib", type=float, default=8)
    ap.add_argument("--untagged-gib", type=float, default=4)
    ap.add_argument("--phase-gib", type=float, default=0,
                    help="0: the device's memory less what the program holds, less 1.5 GiB "
                         "(the context, libraries), plus half the KV cache: more than is free "
                         "before any of the pauses, less than is free during each")
    args = ap.parse_args()
    cycles = args.cycles.split(",")
    for c in cycles:
        if c not in CYCLES:
            sys.exit(f"safe_pause: unknown cycle {c!r}; expected some of {','.join(CYCLES)}")
    app = (Torch if args.framework == "torch" else Cupy)(args)
    if not args.no_pause:
        import vmmshim
        if not vmmshim.loaded():
            sys.exit("safe_pause: run it under the shim (vmmshim run -- python3 ...), or with "
                     "--no-pause for the reference")
        app.vmmshim = vmmshim
    else:
        import contextlib

        class NoShim:
            tag = staticmethod(lambda name: contextlib.nullcontext())
        app.vmmshim = NoShim()
    app.setup()
    held = (args.kv_gib + args.untagged_gib + 0.5) * GIB
    phase = (int(args.phase_gib * GIB) if args.phase_gib
             else int(app.total_bytes() - held - 1.5 * GIB + args.kv_gib * GIB / 2))
    n_phase = phase // 8
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default") or "default"
    mode = alloc_conf if args.framework == "torch" else "cupy-default-pool"
    failures = 0
    for cycle in cycles:
        selection, contents = cycle.split(":")
        keep = contents == "keep"
        free_before = app.free_bytes()
        if not args.no_pause:
            t0 = time.perf_counter()
            paused = pause(app.vmmshim, selection, keep)
            t1 = time.perf_counter()
            measure(f"{mode} {cycle}: paused {paused} bytes in {t1 - t0:.3f} s; free before "
                    f"the pause {free_before / GIB:.1f} GiB, phase {phase / GIB:.1f} GiB")
            if phase <= free_before:
                print(f"safe_pause: the phase ({phase / GIB:.1f} GiB) is not larger than the "
                      f"memory free before the pause ({free_before / GIB:.1f} GiB)")
                failures += 1
        work = app.while_paused(selection, n_phase, args.no_pause)
        if not args.no_pause:
            t0 = time.perf_counter()
            restored = (on_another_thread(app.vmmshim.resume) if selection == "except"
                        else app.vmmshim.resume())
            t1 = time.perf_counter()
            measure(f"{mode} {cycle}: resumed {restored} bytes in {t1 - t0:.3f} s")
        after = app.after_resume(selection, keep if not args.no_pause else False)
        if not after.pop("same_as_before"):
            failures += 1
        fields = " ".join(f"{k}={v}" for k, v in {**work, **after}.items())
        print(f"result {args.framework} {cycle}: {fields}", flush=True)
        failures += work["phase"] != "ok"
    app.finish()
    print(f"safe_pause: {args.framework} {mode}: {len(cycles)} cycles, "
          f"{'reference' if args.no_pause else 'paused'}, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

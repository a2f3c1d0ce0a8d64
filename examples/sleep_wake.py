"""Put a program's GPU memory to sleep and wake it up, as an RL trainer does
with its inference engine (docs/pause-resume.md), on one of five allocators:

  torch        PyTorch's caching allocator (cudaMalloc underneath)
  torch-async  PyTorch with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  torch-expandable  PyTorch with expandable_segments:True (its own VMM
               memory: cuMemCreate/cuMemMap, which the shim pauses too)
  cupy-async   CuPy's MemoryAsyncPool (cudaMallocAsync)
  jax-async    JAX with XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async

The program makes "weights" (kept: paused with their contents) and a "kv"
cache of --kv-gib GiB (dropped: paused without contents), each under its
vmmshim tag, computes a result, then:
  1. pauses "weights" with contents, then everything else without
     (vmmshim.pause(except_tags=["weights"], keep_contents=False)); for JAX,
     whose allocations happen on its own threads, everything with contents;
  2. prints what is left (vmmshim.residency(), nvidia-smi);
  3. allocates --work-gib GiB for another phase, uses and frees it;
  4. resumes everything and recomputes the result.
The result computed after the resume must equal the one before the pause
(else the exit status is 1), and for PyTorch and CuPy the result line equals
a native run that never paused (--no-pause); JAX's results differ between
processes even natively (its autotuning), so only the first check applies. Measurements go to standard error, one line
each, prefixed "sleep_wake:".

    LD_PRELOAD=build/libvmmshim.so PYTHONPATH=python \\
        python3 examples/sleep_wake.py --framework torch-async
    python3 examples/sleep_wake.py --framework torch-async --no-pause   # the reference
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


def log(msg):
    print(f"sleep_wake: {msg}", file=sys.stderr, flush=True)


class Torch:
    def __init__(self, kv_gib):
        import torch
        self.t = torch
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        self.own_pool = "cudaMallocAsync" not in conf and hasattr(torch.cuda, "MemPool")
        g = torch.Generator(device="cpu").manual_seed(7)
        with vmmshim.tag("weights"):  # the model and its input: kept
            self.w = [torch.randn(4096, 4096, generator=g).cuda() for _ in range(8)]
            self.x = torch.randn(256, 4096, generator=g).cuda()
        with vmmshim.tag("kv"):
            self.kv = torch.empty(int(kv_gib * GIB) // 2, dtype=torch.float16, device="cuda")
        self.kv.fill_(1.0)

    def result(self):
        h = self.x
        for w in self.w:
            h = self.t.tanh(h @ w)
        self.t.cuda.synchronize()
        return hashlib.sha256(h.cpu().numpy().tobytes()).hexdigest()[:16]

    def work(self, gib):
        # The other phase allocates from a pool of its own: a pool's allocator
        # hands out the free part of its pages, and a page paused for a
        # tensor may have a free part (under expandable segments, a 20 MiB
        # page shared by a tensor's end and free space), which must not be
        # handed out while paused (docs/pause-resume.md, "Other libraries'
        # VMM memory"). Colocated RL frameworks keep the sleeping engine's
        # pool apart the same way (vLLM's CuMemAllocator gives it a MemPool).
        # The cudaMallocAsync backend has no MemPool.
        own = self.t.cuda.MemPool() if self.own_pool else None
        with self.t.cuda.use_mem_pool(own) if own else contextlib.nullcontext():
            a = self.t.ones(int(gib * GIB) // 4, dtype=self.t.float32, device="cuda")
            s = float(a.sum())
            del a
        self.t.cuda.synchronize()
        del own
        self.t.cuda.empty_cache()
        return s

    def after_resume(self):
        self.kv.fill_(2.0)  # dropped contents: the cache is refilled
        return float(self.kv[:1024].float().sum())

    def sync(self):
        self.t.cuda.synchronize()


class CupyAsync:
    def __init__(self, kv_gib):
        import cupy as cp
        self.cp = cp
        cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
        rs = cp.random.RandomState(7)
        with vmmshim.tag("weights"):  # the model and its input: kept
            self.w = [rs.standard_normal((2048, 2048), dtype=cp.float32) for _ in range(8)]
            self.x = rs.standard_normal((256, 2048), dtype=cp.float32)
        with vmmshim.tag("kv"):
            self.kv = cp.ones(int(kv_gib * GIB) // 4, dtype=cp.float32)
        cp.cuda.Device().synchronize()

    def result(self):
        h = self.x
        for w in self.w:
            h = self.cp.tanh(h @ w)
        return hashlib.sha256(self.cp.asnumpy(h).tobytes()).hexdigest()[:16]

    def work(self, gib):
        a = self.cp.ones(int(gib * GIB) // 4, dtype=self.cp.float32)
        s = float(a.sum())
        del a
        self.cp.cuda.Device().synchronize()
        return s

    def after_resume(self):
        self.kv.fill(2.0)
        return float(self.kv[:1024].sum())

    def sync(self):
        self.cp.cuda.Device().synchronize()


class JaxAsync:
    def __init__(self, kv_gib):
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        key = jax.random.PRNGKey(7)
        self.w = [jax.random.normal(jax.random.fold_in(key, i), (2048, 2048)) for i in range(8)]
        self.kv = jnp.ones(int(kv_gib * GIB) // 4, dtype=jnp.float32)
        self.x = jax.random.normal(jax.random.fold_in(key, 99), (256, 2048))
        self.kv.block_until_ready()

    def result(self):
        h = self.x
        for w in self.w:
            h = self.jnp.tanh(h @ w)
        import numpy as np
        return hashlib.sha256(np.asarray(h).tobytes()).hexdigest()[:16]

    def work(self, gib):
        a = self.jnp.ones(int(gib * GIB) // 4, dtype=self.jnp.float32)
        s = float(a.sum())
        del a
        return s

    def after_resume(self):
        return float(self.kv[:1024].sum())  # kept: JAX's pause keeps contents

    def sync(self):
        self.kv.block_until_ready()


FRAMEWORKS = {"torch": Torch, "torch-async": Torch, "torch-expandable": Torch,
              "cupy-async": CupyAsync,
              "jax-async": JaxAsync}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--framework", choices=sorted(FRAMEWORKS), default="torch")
    ap.add_argument("--kv-gib", type=float, default=16)
    ap.add_argument("--work-gib", type=float, default=16)
    ap.add_argument("--no-pause", action="store_true", help="the reference run")
    args = ap.parse_args()
    if args.framework == "torch-async":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    if args.framework == "torch-expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if args.framework == "jax-async":
        os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "cuda_async"
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    app = FRAMEWORKS[args.framework](args.kv_gib)
    before = app.result()
    log(f"{args.framework}: start: nvidia-smi {smi_used_mib()} MiB")
    if not args.no_pause:
        if not vmmshim.loaded():
            sys.exit("sleep_wake: run it under LD_PRELOAD=libvmmshim.so (or --no-pause)")
        app.sync()
        t0 = time.perf_counter()
        if args.framework == "jax-async":
            # JAX launches on threads of its own: after a pause of everything
            # that holds the other threads' work until the resume, the next
            # phase would wait for ever. The work is synchronized (app.sync)
            # and the next phase uses new memory: nothing to quiesce or hold
            # (docs/pause-resume.md, "Quiescing").
            kept = vmmshim.pause(keep_contents=True, sole_submitter=True)
            dropped = 0
        else:
            kept = vmmshim.pause("weights", keep_contents=True)
            t1 = time.perf_counter()
            dropped = vmmshim.pause(except_tags=["weights"], keep_contents=False)
        t2 = time.perf_counter()
        log(f"{args.framework}: paused {kept} bytes with contents, {dropped} without, "
            f"{t2 - t0:.3f} s; nvidia-smi {smi_used_mib()} MiB")
        res = vmmshim.residency()
        for d in res["devices"]:
            log(f"{args.framework}: residency: " + json.dumps(d, separators=(",", ":")))
        s = app.work(args.work_gib)
        log(f"{args.framework}: other phase of {args.work_gib} GiB: sum {s:.0f}")
        t0 = time.perf_counter()
        restored = vmmshim.resume()
        t1 = time.perf_counter()
        log(f"{args.framework}: resumed {restored} bytes in {t1 - t0:.4f} s; "
            f"nvidia-smi {smi_used_mib()} MiB")
    after = app.result()
    refill = app.after_resume()
    print(f"result {args.framework}: before {before} after {after} kv {refill:.0f}")
    return 0 if before == after else 1


if __name__ == "__main__":
    try:
        import vmmshim
    except ImportError:
        sys.exit("sleep_wake: put vmmshim's python/ on PYTHONPATH (or pip install ./python)")
    sys.exit(main())

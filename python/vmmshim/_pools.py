"""Framework pools: PyTorch's and CuPy's own allocators never hand out paused
memory (docs/pause-resume.md, "The framework's own free space").

Why: a framework allocator keeps the blocks a program frees inside the
memory it got from cudaMalloc and gives them out again. When the shim pauses
that memory, a later allocation can be handed a block of it and fault
(`CUDA error: an illegal memory access`). Two rules keep that from happening:

1. A tag is a pool of the framework's. Inside `vmmshim.tag(X)` a thread's
   allocations go to X's own pool (PyTorch: a `torch.cuda.MemPool` per tag
   and device, routed as `torch.cuda.use_mem_pool` does; CuPy: a
   `cupy.cuda.MemoryPool` per tag, chosen by an allocator installed in place
   of CuPy's default pool), so one pool's memory carries one tag and a pause
   by tag takes whole pools, never free space another allocation can get.
2. A paused pool is never allocated from until its resume. A pause that
   reaches free space other allocations could be given (untagged memory: the
   framework's default pool; or a tag pool some thread is allocating into
   right now) opens a fresh pause pool and routes every allocation there
   (PyTorch: `_cuda_beginAllocateToPool`, every thread and stream; routes
   opened later, such as a CUDA graph capture's or a tag's, still come first,
   as PyTorch searches its routes newest first). A tag entered while its pool
   is paused gets a pool of its own for that block. Every later pause, and
   the pause's own return, replaces an open pause pool (it may hold memory
   of any tag, or another thread's allocation made while the shim paused).
   At the resume that ends the pause of untagged memory the pause pools'
   free segments go back to the driver before the shim maps the paused
   memory again (that memory is what the work done while paused used), and
   blocks still live in them stay valid.

3. What the framework keeps for good and touches on its own is made anew
   from unpaused memory at every pause: PyTorch's cuBLAS workspaces
   (released; the next matmul takes a new one) and its CUDA graphs' RNG
   state (a fresh generator state until the resume that leaves nothing
   paused); CuPy's cuBLAS handle gets a workspace from the pause pool where
   CuPy exposes cublas.setWorkspace. Wholly free cached memory of the pools
   about to be paused goes back first.

Which allocators: PyTorch's native caching allocator (default and
`expandable_segments:True`); under `backend:cudaMallocAsync` the shim is the
allocator and never hands out paused memory, so nothing is routed (rule 3
still applies). CuPy's
default `MemoryPool` (while it is the current allocator); a `MemoryAsyncPool`
or `set_allocator(None)` needs nothing. Sub-allocators the shim cannot see
into (JAX's BFC arena, RMM's pool and arena resources, a CuPy allocator of
the program's own) are named by a warning, once, at the first pause
(`warn_unsafe_allocators`).

Rooms: this module holds the rules' entry points (what vmmshim.tag, pause
and resume call) and the warning about allocators it cannot help;
_torch_pools.py and _cupy_pools.py hold each framework's part.

Thread safety: one lock (vmmshim/_tag_state.py); PyTorch's and CuPy's calls made under it take their
own locks only. Exactness: a pause is exact for allocations made before the
call and after it returns; an allocation another thread makes during the
pause call itself may land in memory being paused, as with any allocator.
"""
import sys
import warnings

from vmmshim._tag_state import current_tag, lock


class Selection:
    """Which tags a pause or resume takes, as the C API's selection does:
    every tag (including untagged ""), one tag, or every tag but some."""

    def __init__(self, only=None, keep=None):
        self.only = only
        self.keep = frozenset(keep) if keep is not None else None

    def __call__(self, tag):
        if self.only is not None:
            return tag == self.only
        if self.keep is not None:
            return tag not in self.keep
        return True


_torch = None  # (the torch module, its TorchPools or None where not usable)
_cupy = None
_warned_unsafe = set()


def _frameworks():
    """The framework pools of the frameworks this program has imported
    (never imports one itself)."""
    global _torch, _cupy
    out = []
    torch = sys.modules.get("torch")
    if torch is not None:
        if _torch is None or _torch[0] is not torch:
            from vmmshim._torch_pools import TorchPools
            pools = TorchPools(torch)
            _torch = (torch, pools if pools.usable() else None)
        if _torch[1] is not None:
            out.append(_torch[1])
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        if _cupy is None:
            from vmmshim._cupy_pools import CupyPools
            _cupy = CupyPools(cupy)
        if _cupy.install():
            out.append(_cupy)
    return out


def enter_tag(tag):
    """Called by vmmshim.tag on entry, after the thread's tag is set; returns
    the undo for leave_tag."""
    tag = tag or ""
    with lock:
        tokens = []
        for fw in _frameworks():
            if hasattr(fw, "enter"):  # PyTorch's: routes are per thread
                token = fw.enter(tag)
                if token is not None:
                    tokens.append((fw, token))
        return tokens


def leave_tag(tokens):
    with lock:
        for fw, token in reversed(tokens):
            fw.exit(token)


def before_pause(selected):
    """Returns the undo for pause_failed."""
    with lock:
        fws = _frameworks()
    warn_unsafe_allocators()
    with lock:
        return [(fw, fw.before_pause(selected)) for fw in fws]


def after_pause(undo):
    with lock:
        for fw, u in undo:
            hook = getattr(fw, "after_pause", None)
            if hook is not None:
                hook(u)


def pause_failed(undo):
    with lock:
        for fw, u in undo:
            fw.pause_failed(u)


def before_resume(selected):
    with lock:
        fws = _frameworks()
        for fw in fws:
            fw.before_resume(selected)
        return fws


def after_resume(fws, selected, ok):
    with lock:
        for fw in fws:
            fw.after_resume(selected, ok)


def release_cached(fws):
    """Gives the frameworks' cached free memory back to the driver (for a
    resume that ran short); whether there was a framework to ask."""
    with lock:
        for fw in fws:
            fw.release_cached()
        return bool(fws)


def unsafe_allocators():
    """(name, what to do) for each allocator in this process that
    sub-allocates from memory the shim pauses whole, and whose free space the
    shim cannot keep from being handed out while paused."""
    import os
    found = []
    if "jax" in sys.modules or "jaxlib" in sys.modules:
        kind = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default")
        if kind not in ("platform", "cuda_async"):
            found.append(("JAX's BFC arena (XLA_PYTHON_CLIENT_ALLOCATOR="
                          f"{kind})", "set XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async"))
    if _torch and _torch[1] is not None and _torch[1].backend == "native" \
            and not _torch[1].native:
        found.append((f"PyTorch {getattr(_torch[0], '__version__', '?')}'s caching allocator "
                      "(this PyTorch has no MemPool routing for the shim to use; checked with "
                      "2.11)", "use a PyTorch with torch.cuda.MemPool, or "
                      "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"))
    rmm = sys.modules.get("rmm")
    if rmm is not None:
        try:
            mr = rmm.mr.get_current_device_resource()
            chain = []
            while mr is not None and len(chain) < 8:
                chain.append(type(mr).__name__)
                mr = getattr(mr, "upstream_mr", None)
            if any(n in ("PoolMemoryResource", "ArenaMemoryResource",
                         "FixedSizeMemoryResource", "BinningMemoryResource") for n in chain):
                found.append((f"RMM's {chain[0]}", "use rmm.mr.CudaAsyncMemoryResource"))
        except Exception:  # noqa: BLE001: rmm without a device
            pass
    if _cupy and not _cupy.installed:
        try:
            allocator = _cupy.cupy.cuda.get_allocator()
            name = getattr(allocator, "__qualname__", type(allocator).__name__)
            if not any(safe in name for safe in ("MemoryAsyncPool", "malloc_async")) \
                    and name != "_malloc":
                found.append((f"a CuPy allocator of the program's own ({name})",
                              "use CuPy's default pool or cupy.cuda.MemoryAsyncPool"))
        except Exception:  # noqa: BLE001
            pass
    return found


def warn_unsafe_allocators():
    for name, fix in unsafe_allocators():
        if name in _warned_unsafe:
            continue
        _warned_unsafe.add(name)
        warnings.warn(
            f"vmmshim: {name} sub-allocates from memory a pause releases whole; while "
            f"paused it can hand out paused memory and the program faults. {fix} "
            "(docs/pause-resume.md)", RuntimeWarning, stacklevel=4)

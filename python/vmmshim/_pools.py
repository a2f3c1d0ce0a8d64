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
   is paused gets a pool of its own for that block. At resume the pause
   pool's free segments go back to the driver before the shim maps the paused
   memory again (that memory is what the work done while paused used), and
   blocks still live in it stay valid.

3. What the framework keeps for good and touches on its own is made anew
   from unpaused memory when untagged memory is paused: PyTorch's cuBLAS
   workspaces (released; the next matmul takes a new one) and its CUDA
   graphs' RNG state (a fresh generator state until the resume); CuPy's
   cuBLAS handle gets a workspace from the pause pool.

Which allocators: PyTorch's native caching allocator (default and
`expandable_segments:True`); under `backend:cudaMallocAsync` the shim is the
allocator and never hands out paused memory, so nothing is routed (rule 3
still applies). CuPy's
default `MemoryPool` (while it is the current allocator); a `MemoryAsyncPool`
or `set_allocator(None)` needs nothing. Sub-allocators the shim cannot see
into (JAX's BFC arena, RMM's pool and arena resources, a CuPy allocator of
the program's own) are named by a warning, once, at the first pause
(`warn_unsafe_allocators`).

Thread safety: one lock; PyTorch's and CuPy's calls made under it take their
own locks only. Exactness: a pause is exact for allocations made before the
call and after it returns; an allocation another thread makes during the
pause call itself may land in memory being paused, as with any allocator.
"""
import sys
import threading
import warnings

_lock = threading.RLock()
_thread = threading.local()


def current_tag():
    """The innermost vmmshim.tag of this thread ("" untagged)."""
    stack = getattr(_thread, "stack", None)
    return (stack[-1] or "") if stack else ""


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


class _TorchPools:
    """PyTorch's native caching allocator: a MemPool per (tag, device), a
    pause pool per device while untagged or routed memory is paused."""

    def __init__(self, torch):
        self.torch = torch
        c = torch._C
        self.begin_all = getattr(c, "_cuda_beginAllocateToPool", None)
        self.end = (getattr(c, "_cuda_endAllocateToPool", None)
                    or getattr(c, "_cuda_endAllocateCurrentStreamToPool", None))
        self.release = getattr(c, "_cuda_releasePool", None)
        self.begin_thread = getattr(c, "_cuda_beginAllocateCurrentThreadToPool", None)
        self.native = False     # routing (usable() decides)
        self.primary = {}       # (tag, device) -> MemPool
        self.routed = {}        # (tag, device) -> thread ident routing the primary pool
        self.paused = set()     # tags whose primary pools are paused ("" the default pool)
        self.pause_pools = {}   # device -> pool handle of the open pause pool
        self.resuming = {}      # device -> pause pool handle opened for a resume
        self.graph_rng = {}     # device -> the generator state kept while paused
        self.own_routes = 0     # routes to pools of a block's own, open now
        self.deferred = []      # MemPools whose end waits for our routes to close

    def usable(self):
        """Whether PyTorch can use CUDA here; sets `native`: its caching
        allocator, whose pools are routed (under backend:cudaMallocAsync
        only the state PyTorch keeps for good is handled at a pause)."""
        torch = self.torch
        try:
            if not torch.cuda.is_available():
                return False
            backend = torch.cuda.memory.get_allocator_backend()
        except Exception:  # noqa: BLE001: a CPU-only build, a broken CUDA
            return False
        routes = None not in (self.begin_all, self.end, self.release, self.begin_thread)
        self.native = (backend == "native" and routes and hasattr(torch.cuda, "MemPool")
                       and hasattr(torch.cuda, "graph_pool_handle"))
        if self.native:
            self.defer_pool_ends()
        return True

    def routes_open(self):
        return bool(self.routed or self.own_routes or self.pause_pools or self.resuming)

    def defer_pool_ends(self):
        """A MemPool that ends while any route is open takes PyTorch down
        (~MemPool empties its cache, and that asserts no route is open:
        `captures_underway.empty() INTERNAL ASSERT FAILED`, seen on the
        H200 with a program's own MemPool deleted while paused). While one of
        ours is open, a MemPool that ends is kept (its finalizer keeps a
        reference) and let go once ours have closed."""
        cls = self.torch.cuda.MemPool
        if "__del__" in cls.__dict__:
            return
        pools = self

        def __del__(pool):
            if pools.routes_open():
                pools.deferred.append(pool)

        cls.__del__ = __del__

    def end_deferred(self):
        if self.deferred and not self.routes_open():
            self.deferred = []

    def devices(self):
        """Devices whose context PyTorch has made (never makes one)."""
        torch = self.torch
        if not torch.cuda.is_initialized():
            return []
        has = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        count = torch.cuda.device_count()
        if has is None:
            return [torch.cuda.current_device()]
        return [d for d in range(count) if has(d)]

    def release_cached(self):
        # The default pool and every freeable pool (the default pool only
        # while no route is open: PyTorch's rule).
        self.torch.cuda.empty_cache()

    # ---- tags ----
    def enter(self, tag):
        """Routes this thread's allocations on the current device to `tag`'s
        pool; returns what exit() undoes, or None (nothing routed)."""
        torch = self.torch
        if not self.native or torch.cuda.is_current_stream_capturing():
            return None  # the shim's stream-ordered memory; or the capture's pool
        device = torch.cuda.current_device()
        key = (tag, device)
        me = threading.get_ident()
        if self.routed.get(key) == me:
            return None  # nested inside the same tag: already routed
        if tag not in self.paused and key not in self.routed:
            pool = self.primary.get(key)
            if pool is None:
                pool = self.primary[key] = torch.cuda.MemPool()
            self.begin_thread(device, pool.id)
            self.routed[key] = me
            return ("primary", key, pool.id)
        # Paused, or another thread routes the primary pool (PyTorch allows
        # one route per pool): a pool of this block's own, whose free space is
        # given back at the next empty_cache once the block ends.
        handle = torch.cuda.graph_pool_handle()
        self.begin_thread(device, handle)
        self.own_routes += 1
        return ("own", key, handle)

    def exit(self, token):
        kind, key, pool_id = token
        self.end(key[1], pool_id)
        self.release(key[1], pool_id)  # a primary pool keeps its MemPool's count
        if kind == "primary":
            self.routed.pop(key, None)
        else:
            self.own_routes -= 1
        self.end_deferred()

    # ---- pause and resume ----
    def before_pause(self, selected):
        """Marks the selected pools paused and opens a pause pool where
        allocations could otherwise be given paused free space. Returns the
        undo for a pause that fails."""
        torch = self.torch
        devices = self.devices()
        if not devices:
            return None
        untagged = selected("")
        routed = any(selected(tag) for (tag, _d) in self.routed)
        if untagged and self.native and not self.pause_pools and not self.routed:
            # Wholly free cached segments go back first: neither copied nor
            # paused (only possible while no route is open).
            torch.cuda.empty_cache()
        opened, retired = {}, {}
        if self.native and (untagged or routed):
            for d in devices:
                handle = torch.cuda.graph_pool_handle()
                self.begin_all(d, handle)
                opened[d] = handle
                old = self.pause_pools.get(d)
                if old is not None:
                    # Its memory may be paused now: never routed to again
                    # (released: its free segments go at the next empty_cache).
                    self.end(d, old)
                    self.release(d, old)
                    retired[d] = old
                self.pause_pools[d] = handle
        newly = {tag for (tag, _d) in self.primary if selected(tag)} - self.paused
        swapped = {}
        if untagged:
            newly.add("")
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None:
                # cuBLAS keeps a workspace block for good; given back, the next
                # matmul takes a new one from the pause pool.
                clear()
            swapped = self.swap_graph_rng(devices)
        self.paused |= newly
        return (opened, retired, newly, swapped)

    def swap_graph_rng(self, devices):
        """PyTorch keeps its CUDA graphs' RNG seed and offset in two device
        tensors made with the first capture and written at every capture and
        replay; paused, they would fault the next one. A fresh generator
        state takes the default generator's place until the resume
        (torch.Generator's graph-safe API), its seed and offset carried back
        then, so random streams go on as if never paused."""
        swapped = {}
        gens = getattr(self.torch.cuda, "default_generators", ())
        for d in devices:
            if d >= len(gens):
                continue
            gen = gens[d]
            if not all(hasattr(gen, f) for f in ("graphsafe_get_state", "graphsafe_set_state",
                                                 "clone_state")):
                continue
            kept = gen.graphsafe_get_state()
            gen.graphsafe_set_state(gen.clone_state())
            swapped[d] = kept
        self.graph_rng.update(swapped)
        return swapped

    def restore_graph_rng(self, devices=None):
        if not self.graph_rng:
            return
        gens = self.torch.cuda.default_generators
        for d in list(self.graph_rng):
            if devices is not None and d not in devices:
                continue
            kept = self.graph_rng.pop(d)
            gen = gens[d]
            seed, offset = gen.initial_seed(), gen.get_offset()
            gen.graphsafe_set_state(kept)
            if (gen.initial_seed(), gen.get_offset()) != (seed, offset):
                gen.manual_seed(seed)
                gen.set_offset(offset)

    def pause_failed(self, undo):
        if undo is None:
            return
        opened, retired, newly, swapped = undo
        self.paused -= newly
        self.restore_graph_rng(swapped)
        for d, handle in opened.items():
            if d in retired:
                continue  # the earlier pause's pool was let go: this one serves on
            self.end(d, handle)
            self.release(d, handle)
            self.pause_pools.pop(d, None)
        self.end_deferred()

    def before_resume(self, selected):
        """When this resume ends the need for the pause pools: a fresh one
        takes allocations during the resume, the old ones' free segments go
        back to the driver first (the resume needs that memory)."""
        if not self.pause_pools:
            return
        still = {tag for tag in self.paused if not selected(tag)}
        if "" in still or any(tag in still for (tag, _d) in self.routed):
            return
        torch = self.torch
        for d, old in list(self.pause_pools.items()):
            handle = torch.cuda.graph_pool_handle()
            self.begin_all(d, handle)
            self.resuming[d] = handle
            self.end(d, old)
            self.release(d, old)
        self.pause_pools = {}
        torch.cuda.empty_cache()  # freeable pools' free segments, under any route

    def after_resume(self, selected, ok):
        if not ok:
            # Still paused: the resume's pool stays the pause pool.
            self.pause_pools.update(self.resuming)
            self.resuming = {}
            return
        self.paused = {tag for tag in self.paused if not selected(tag)}
        if "" not in self.paused:
            self.restore_graph_rng()
        for d, handle in self.resuming.items():
            self.end(d, handle)
            self.release(d, handle)
        if self.resuming:
            self.resuming = {}
            self.torch.cuda.empty_cache()
        self.end_deferred()


class _CupyPools:
    """CuPy's default MemoryPool: an allocator in its place that picks a pool
    by the thread's tag and what is paused."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.default = None
        self.installed = False
        self.tagged = {}          # tag -> [MemoryPool, ...]: [0] the tag's own
        self.paused = set()       # tags whose pools are paused ("" the default pool)
        self.paused_pools = []    # the pools holding paused memory
        self.pause_pool = None    # untagged allocations while "" is paused
        self.while_paused = []    # pools opened during a pause, drained at resume
        self.workspaces = {}      # cuBLAS handle -> the workspace set at a pause

    def install(self):
        """Takes the place of CuPy's default pool if that is the current
        allocator; False when another allocator is (the program's own)."""
        cupy = self.cupy
        try:
            current = cupy.cuda.get_allocator()
            if self.installed:
                return current == self.malloc
            default = cupy.get_default_memory_pool()
            if current != default.malloc:
                return False
            cupy.cuda.set_allocator(self.malloc)
        except Exception:  # noqa: BLE001: inside using_allocator, or no CUDA
            return False
        self.default = default
        self.installed = True
        return True

    def _is_paused(self, pool):
        return any(p is pool for p in self.paused_pools)

    def _pool(self, tag):
        with _lock:
            if not tag:
                if "" not in self.paused:
                    return self.default
                if self.pause_pool is None:
                    self.pause_pool = self.cupy.cuda.MemoryPool()
                    self.while_paused.append(self.pause_pool)
                return self.pause_pool
            pools = self.tagged.setdefault(tag, [])
            for pool in pools:
                if not self._is_paused(pool):
                    return pool
            pool = self.cupy.cuda.MemoryPool()
            pools.append(pool)
            self.while_paused.append(pool)
            return pool

    def malloc(self, size):
        return self._pool(current_tag()).malloc(size)

    def release_cached(self):
        if not self.installed:
            return
        for pool in [self.default] + [p for ps in self.tagged.values() for p in ps] + \
                self.while_paused:
            pool.free_all_blocks()

    def before_pause(self, selected):
        if not self.installed:
            return None
        newly = set()
        before = list(self.paused_pools)
        if selected("") and "" not in self.paused:
            newly.add("")
            self.default.free_all_blocks()  # wholly free chunks: not paused
            if self.pause_pool is not None:
                # Its memory is paused now too: a fresh one takes its place.
                self.paused_pools.append(self.pause_pool)
                self.pause_pool = None
        for tag, pools in self.tagged.items():
            if selected(tag):
                newly.add(tag)
                self.paused_pools += [p for p in pools if not self._is_paused(p)]
        newly -= self.paused
        self.paused |= newly
        return (newly, before)

    def after_pause(self, undo):
        # Only once the memory is paused: a pause pool made before would have
        # its first chunk paused with everything else.
        if undo is not None and "" in undo[0]:
            self.swap_cublas_workspace()

    def swap_cublas_workspace(self):
        """cuBLAS keeps a workspace for good (its own, or the last one set);
        while untagged memory is paused it works in one from the pause pool,
        which stays its workspace after the resume (32 MiB, what cuBLAS
        takes on Hopper; the current thread's handle on the current
        device)."""
        try:
            from cupy_backends.cuda.libs import cublas
            handle = self.cupy.cuda.device.get_cublas_handle()
            size = 32 << 20
            workspace = self._pool("").malloc(size)
            cublas.setWorkspace(handle, workspace.ptr, size)
        except Exception:  # noqa: BLE001: an older CuPy, no cuBLAS
            return
        self.workspaces[handle] = workspace  # the one it replaces is freed

    def pause_failed(self, undo):
        if undo is None:
            return
        newly, before = undo
        self.paused -= newly
        self.paused_pools = before

    def before_resume(self, selected):
        if not self.installed:
            return
        # The pools that served the paused time give their free chunks back
        # first: the resume needs that memory. Their live blocks stay valid.
        for pool in self.while_paused:
            pool.free_all_blocks()

    def after_resume(self, selected, ok):
        if not ok or not self.installed:
            return
        self.paused = {tag for tag in self.paused if not selected(tag)}
        keep = []
        for pool in self.paused_pools:
            tag = next((t for t, ps in self.tagged.items() if any(p is pool for p in ps)), "")
            if not selected(tag):
                keep.append(pool)
        self.paused_pools = keep  # the old pause pools among them are dropped
        if "" not in self.paused and self.pause_pool is not None:
            self.pause_pool.free_all_blocks()
            self.pause_pool = None  # dropped: its live blocks free to the driver
        self.while_paused = [p for p in self.while_paused if p is self.pause_pool]


_torch = None  # (the torch module, its _TorchPools or None where not usable)
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
            pools = _TorchPools(torch)
            _torch = (torch, pools if pools.usable() else None)
        if _torch[1] is not None:
            out.append(_torch[1])
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        if _cupy is None:
            _cupy = _CupyPools(cupy)
        if _cupy.install():
            out.append(_cupy)
    return out


def enter_tag(tag):
    """Called by vmmshim.tag on entry, after the thread's tag is set; returns
    the undo for leave_tag."""
    if not tag:
        return []
    with _lock:
        tokens = []
        for fw in _frameworks():
            if isinstance(fw, _TorchPools):
                token = fw.enter(tag)
                if token is not None:
                    tokens.append((fw, token))
        return tokens


def leave_tag(tokens):
    with _lock:
        for fw, token in reversed(tokens):
            fw.exit(token)


def before_pause(selected):
    """Returns the undo for pause_failed."""
    with _lock:
        fws = _frameworks()
    warn_unsafe_allocators()
    with _lock:
        return [(fw, fw.before_pause(selected)) for fw in fws]


def after_pause(undo):
    with _lock:
        for fw, u in undo:
            hook = getattr(fw, "after_pause", None)
            if hook is not None:
                hook(u)


def pause_failed(undo):
    with _lock:
        for fw, u in undo:
            fw.pause_failed(u)


def before_resume(selected):
    with _lock:
        fws = _frameworks()
        for fw in fws:
            fw.before_resume(selected)
        return fws


def after_resume(fws, selected, ok):
    with _lock:
        for fw in fws:
            fw.after_resume(selected, ok)


def release_cached(fws):
    """Gives the frameworks' cached free memory back to the driver (for a
    resume that ran short); whether there was a framework to ask."""
    with _lock:
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

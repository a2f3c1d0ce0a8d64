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
   from unpaused memory when untagged memory is paused: PyTorch's cuBLAS
   workspaces (released; the next matmul takes a new one) and its CUDA
   graphs' RNG state (a fresh generator state until the resume), again
   whenever a later pause replaces a pause pool; CuPy's cuBLAS handle gets a
   workspace from the pause pool where CuPy exposes cublas.setWorkspace.

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
        self.backend = None     # PyTorch's allocator backend
        self.primary = {}       # (tag, device) -> MemPool
        self.routed = {}        # (tag, device) -> thread ident routing the primary pool
        self.own = {}           # (tag, device) -> routes to pools of a block's own, open now
        self.paused = set()     # tags whose primary pools are paused ("" the default pool)
        self.pause_pools = {}   # device -> pool handle of the open pause pool
        self.resuming = {}      # device -> pause pool handle opened for a resume
        self.graph_rng = {}     # device -> the generator state kept while paused
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
        self.backend = backend
        self.native = (backend == "native" and routes and hasattr(torch.cuda, "MemPool")
                       and hasattr(torch.cuda, "graph_pool_handle"))
        if self.native:
            self.defer_pool_ends()
        return True

    def routes_open(self):
        return bool(self.routed or self.own or self.pause_pools or self.resuming)

    def routed_tags(self):
        """Tags some thread is allocating into right now."""
        return {tag for (tag, _d) in self.routed} | {tag for (tag, _d) in self.own}

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
        """For a resume short of memory: the open pause pools give way to
        fresh ones (released, their free segments can go), then the default
        pool (only while no route is open: PyTorch's rule) and every
        freeable pool give their free segments back."""
        self.renew_pause_pools()
        self.torch.cuda.empty_cache()

    def renew_pause_pools(self):
        """Every open pause pool is replaced by a fresh one, and released: it
        is never routed to again, and its free segments go back at the next
        empty_cache (its live blocks stay valid)."""
        torch = self.torch
        for d, old in list(self.pause_pools.items()):
            handle = torch.cuda.graph_pool_handle()
            self.begin_all(d, handle)
            self.end(d, old)
            self.release(d, old)
            self.pause_pools[d] = handle

    # ---- tags ----
    def enter(self, tag):
        """Routes this thread's allocations on every device with a context
        (and the current one) to `tag`'s pool ("": untagged inside another
        tag); returns what exit() undoes, or None (nothing routed)."""
        torch = self.torch
        if not self.native or torch.cuda.is_current_stream_capturing():
            return None  # the shim's stream-ordered memory; or the capture's pool
        stack = getattr(_thread, "torch_routes", None)
        if stack is None:
            stack = _thread.torch_routes = []
        if not tag and not stack:
            return None  # untagged, outside every tag: the default pool
        devices = sorted(set(self.devices()) | {torch.cuda.current_device()})
        me = threading.get_ident()
        tokens = []
        try:
            self._enter_devices(tag, devices, stack, me, tokens)
        except BaseException:
            self.exit(tokens)  # what was routed before the failure
            raise
        return tokens or None

    def _enter_devices(self, tag, devices, stack, me, tokens):
        torch = self.torch
        for d in devices:
            key = (tag, d)
            newest = next((k for k in reversed(stack) if k[1] == d), None)
            if tag and self.routed.get(key) == me and newest == key:
                continue  # nested inside the same tag: already routed
            if tag and tag not in self.paused and key not in self.routed:
                pool = self.primary.get(key)
                if pool is None:
                    with torch.cuda.device(d):
                        pool = self.primary[key] = torch.cuda.MemPool()
                self.begin_thread(d, pool.id)
                self.routed[key] = me
                tokens.append(("primary", key, pool.id))
            else:
                # Paused, routed by another thread (PyTorch allows one route
                # per pool), nested under another tag, or untagged inside a
                # tag: a pool of this block's own, whose free space goes back
                # at the next empty_cache once the block ends.
                handle = torch.cuda.graph_pool_handle()
                self.begin_thread(d, handle)
                self.own[key] = self.own.get(key, 0) + 1
                tokens.append(("own", key, handle))
            stack.append(key)

    def exit(self, tokens):
        stack = _thread.torch_routes
        for kind, key, pool_id in reversed(tokens):
            self.end(key[1], pool_id)
            self.release(key[1], pool_id)  # a primary pool keeps its MemPool's count
            if kind == "primary":
                self.routed.pop(key, None)
            else:
                self.own[key] -= 1
                if not self.own[key]:
                    del self.own[key]
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] == key:
                    del stack[i]
                    break
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
        routed = any(selected(tag) for tag in self.routed_tags())
        if untagged and self.native and not self.routes_open():
            # Wholly free cached segments go back first: neither copied nor
            # paused (only possible while no route is open).
            torch.cuda.empty_cache()
        opened, retired = {}, {}
        # An open pause pool may hold memory of any tag: every pause replaces it.
        if self.native and (untagged or routed or self.pause_pools):
            for d in devices:
                handle = torch.cuda.graph_pool_handle()
                self.begin_all(d, handle)
                opened[d] = handle
                old = self.pause_pools.get(d)
                if old is not None:
                    self.end(d, old)
                    self.release(d, old)
                    retired[d] = old
                self.pause_pools[d] = handle
        newly = {tag for (tag, _d) in self.primary if selected(tag)} - self.paused
        swapped = []
        if untagged or retired:
            newly |= {""} if untagged else set()
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None:
                # cuBLAS keeps a workspace block for good; given back, the next
                # matmul takes a new one from the pause pool.
                clear()
            swapped = self.swap_graph_rng(devices)
        newly -= self.paused
        self.paused |= newly
        return (opened, retired, newly, swapped)

    def after_pause(self, undo):
        """The pause pools opened before the shim's pause may have served
        another thread meanwhile, and that memory is paused now: fresh ones
        take their place."""
        if undo is not None and undo[0]:
            self.renew_pause_pools()

    def swap_graph_rng(self, devices):
        """PyTorch keeps its CUDA graphs' RNG seed and offset in two device
        tensors made with the first capture and written at every capture and
        replay; paused, they would fault the next one. A fresh generator
        state takes the default generator's place until the resume
        (torch.Generator's graph-safe API), its seed and offset carried back
        then, so random streams go on as if never paused. A later pause takes
        a fresh one again; the state kept is always the one from before the
        first. Returns the devices whose state was kept by this call."""
        kept_now = []
        gens = getattr(self.torch.cuda, "default_generators", ())
        for d in devices:
            if d >= len(gens):
                continue
            gen = gens[d]
            if not all(hasattr(gen, f) for f in ("graphsafe_get_state", "graphsafe_set_state",
                                                 "clone_state")):
                continue
            if d not in self.graph_rng:
                self.graph_rng[d] = gen.graphsafe_get_state()
                kept_now.append(d)
            gen.graphsafe_set_state(gen.clone_state())
        return kept_now

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
        if "" in still or still & self.routed_tags():
            return
        self.renew_pause_pools()
        self.resuming, self.pause_pools = self.pause_pools, {}
        self.torch.cuda.empty_cache()  # freeable pools' free segments, under any route

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
    by the thread's tag and what is paused. Every pool made is kept for the
    process: an allocation holds its pool only weakly, and a pool that goes
    frees the memory it owns, live blocks included."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.default = None
        self.installed = False
        self.tagged = {}          # tag -> [MemoryPool, ...]: [0] the tag's own
        self.paused = set()       # tags whose pools are paused ("" the default pool)
        self.paused_pools = []    # the pools holding paused memory
        self.pause_pool = None    # untagged allocations while "" is paused
        self.untagged = []        # every pause pool made (kept; see above)
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
                    self.untagged.append(self.pause_pool)
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
                self.untagged:
            pool.free_all_blocks()

    def _mark_paused(self, selected):
        """Marks the pools of the selection paused (and retires the pause
        pool when untagged memory is selected: it may hold any of it)."""
        if selected("") and self.pause_pool is not None:
            self.paused_pools.append(self.pause_pool)
            self.pause_pool = None
        for tag, pools in self.tagged.items():
            if selected(tag):
                self.paused_pools += [p for p in pools if not self._is_paused(p)]

    def before_pause(self, selected):
        if not self.installed:
            return None
        before = list(self.paused_pools), self.pause_pool
        newly = {tag for tag in self.tagged if selected(tag)}
        if selected(""):
            newly.add("")
            if "" not in self.paused:
                self.default.free_all_blocks()  # wholly free chunks: not paused
        self._mark_paused(selected)
        newly -= self.paused
        self.paused |= newly
        return (newly, before, selected)

    def after_pause(self, undo):
        """Pools made between the bookkeeping and the shim's pause (another
        thread's allocation) hold paused memory now: marked so. cuBLAS's
        workspace is taken only now, from a pause pool made after the
        pause."""
        if undo is None:
            return
        newly, _before, selected = undo
        self._mark_paused(selected)
        if "" in newly:
            self.swap_cublas_workspace()

    def swap_cublas_workspace(self):
        """cuBLAS keeps a workspace for good (its own, or the last one set);
        while untagged memory is paused it works in one from the pause pool,
        which stays its workspace after the resume (32 MiB, what cuBLAS
        takes on Hopper; the current thread's handle on the current
        device)."""
        try:
            from cupy_backends.cuda.libs import cublas
            if not hasattr(cublas, "setWorkspace"):
                return  # CuPy 14.2 has none: its cuBLAS worked on while paused (H200)
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
        newly, (paused_pools, pause_pool), _selected = undo
        self.paused -= newly
        self.paused_pools = paused_pools
        if self.pause_pool is None:
            self.pause_pool = pause_pool

    def before_resume(self, selected):
        if not self.installed:
            return
        # The pools that served the paused time give their free chunks back
        # first: the resume needs that memory. Their live blocks stay valid.
        for pool in self.while_paused + self.untagged:
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
        self.paused_pools = keep
        if "" not in self.paused and self.pause_pool is not None:
            self.pause_pool.free_all_blocks()
            self.pause_pool = None  # kept in self.untagged: its live blocks stay valid
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
    tag = tag or ""
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

"""PyTorch's caching allocator kept off paused memory: a MemPool per tag and
device, the pause pool, and the state PyTorch keeps for good (the rules are
in vmmshim/_pools.py, which calls this under its lock)."""
import threading

from vmmshim._tag_state import thread


class TorchPools:
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
        self.known = {""}       # every tag entered ("" untagged): what a pause can take
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
        stack = getattr(thread, "torch_routes", None)
        if stack is None:
            stack = thread.torch_routes = []
        self.known.add(tag)
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
        stack = thread.torch_routes
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
        newly = {tag for tag in self.known if selected(tag)} - self.paused
        # What PyTorch keeps for good lives wherever it was first made (the
        # default pool, or the pool of the tag a thread was in): at every
        # pause it is made anew from memory that is not paused.
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()  # cuBLAS's workspace: the next matmul takes a new one
        swapped = self.swap_graph_rng(devices)
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
        state takes the default generator's place until the resume that
        leaves nothing paused (torch.Generator's graph-safe API), its seed
        and offset carried back then, so random streams go on as if never
        paused. Every pause takes a fresh one again; the state kept is always
        the one from before the first. Returns the devices whose state was
        kept by this call."""
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
        if not self.paused:
            self.restore_graph_rng()
        for d, handle in self.resuming.items():
            self.end(d, handle)
            self.release(d, handle)
        if self.resuming:
            self.resuming = {}
            self.torch.cuda.empty_cache()
        self.end_deferred()

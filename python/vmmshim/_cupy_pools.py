"""CuPy's default memory pool kept off paused memory: an allocator in its
place that picks a pool per tag, and the pause pool (the rules are in
vmmshim/_pools.py, which calls this under its lock)."""
from vmmshim._tag_state import current_tag, lock


class CupyPools:
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
        with lock:
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
        # Wholly free chunks of the pools about to be paused go back first:
        # neither paused nor copied.
        going = [p for t, ps in self.tagged.items() if selected(t) for p in ps]
        if selected(""):
            newly.add("")
            going += [self.default] + ([self.pause_pool] if self.pause_pool else [])
        for pool in going:
            pool.free_all_blocks()
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

"""vmmshim's framework pools (python/vmmshim/_pools.py) on the simulated
driver: no allocation made while paused lands in paused memory.

PyTorch and CuPy cannot run on the simulated driver, so their allocators'
rules that the pools rely on are modelled here, small and strict, over real
shim allocations (cuMemAlloc through libvmmshim.so on the simulated
libcuda.so.1, so that a pause really unmaps them and a touch of paused memory
really fails):
  PyTorch's caching allocator: segments from cudaMalloc, freed blocks kept
  per pool and handed out again (best fit); routes searched newest first
  (`captures_underway`), one route per pool ("already recording to
  mempool_id"); MemPool and graph_pool_handle ids; use counts, a pool that
  reaches 0 is freeable and cannot be routed again (TORCH_INTERNAL_ASSERT);
  empty_cache releases the default pool only without routes, and freeable
  pools' wholly free segments always; clearCublasWorkspaces frees a block.
  CuPy: set_allocator / get_allocator (refused inside using_allocator), the
  default MemoryPool, MemoryPool.malloc / free_all_blocks.
The real frameworks are checked on a GPU (tests/gpu/gpu_check.sh safe_pause).

Runs under LD_PRELOAD=libvmmshim.so with LD_LIBRARY_PATH at the simulated
driver (ctest: python_framework_pools)."""
import ctypes
import os
import sys
import threading
import types
import unittest
import warnings
import weakref

MIB = 1 << 20
SEGMENT = 2 * MIB

ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)  # the simulated driver
cu = ctypes.CDLL(None)  # global lookup: the shim's hooks come first
cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
cu.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
cu.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]


CONTEXTS = {}  # device -> its primary context (setUpClass)


def driver_alloc(size, device=0):
    p = ctypes.c_uint64()
    cu.cuCtxSetCurrent(CONTEXTS[device])
    rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size))
    if rc != 0:
        raise MemoryError(f"cuMemAlloc_v2: {rc}")
    return p.value


def touch(ptr, size):
    """True when the memory can be written (a paused range cannot)."""
    return cu.cuMemsetD8_v2(ptr, 0x5A, size) == 0


class Pool:
    def __init__(self):
        self.use_count = 1
        self.segments = {}  # base -> size
        self.free = []      # (ptr, size) free blocks

    def take(self, size):
        fits = sorted((s, p) for p, s in self.free if s >= size)
        if not fits:
            return None
        s, p = fits[0]
        self.free.remove((p, s))
        if s > size:
            self.free.append((p + size, s - size))
        return p


class CachingAllocator:
    """The rules of PyTorch's caching allocator the pools rely on."""

    def __init__(self, device=0):
        self.device = device
        self.pools = {(0, 0): Pool()}
        self.routes = []  # (pool id, filter(thread ident) -> bool), newest last
        self.blocks = {}  # ptr -> (pool id, size)
        self.freeable = set()

    def create_or_incref(self, pid):
        pool = self.pools.get(pid)
        if pool is None:
            self.pools[pid] = Pool()
        else:
            assert pool.use_count > 0, "TORCH_INTERNAL_ASSERT: use_count > 0"
            pool.use_count += 1

    def begin(self, pid, flt):
        self.create_or_incref(pid)
        if any(r[0] == pid for r in self.routes):
            raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
        self.routes.append((pid, flt))

    def end(self, pid):
        for i, r in enumerate(self.routes):
            if r[0] == pid:
                del self.routes[i]
                return
        raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    def release(self, pid):
        pool = self.pools[pid]
        pool.use_count -= 1
        assert pool.use_count >= 0
        if pool.use_count == 0:
            self.freeable.add(pid)

    def malloc(self, size):
        me = threading.get_ident()
        pid = next((r[0] for r in reversed(self.routes) if r[1](me)), (0, 0))
        pool = self.pools[pid]
        size = (size + 511) // 512 * 512
        ptr = pool.take(size)
        if ptr is None:
            seg = max(SEGMENT, (size + SEGMENT - 1) // SEGMENT * SEGMENT)
            base = driver_alloc(seg, self.device)
            pool.segments[base] = seg
            pool.free.append((base, seg))
            ptr = pool.take(size)
        self.blocks[ptr] = (pid, size)
        return ptr

    def free(self, ptr):
        pid, size = self.blocks.pop(ptr)
        self.pools[pid].free.append((ptr, size))

    def release_free_segments(self, pid):
        pool = self.pools[pid]
        for base, seg in list(pool.segments.items()):
            if (base, seg) in pool.free:  # wholly free (blocks are never merged here)
                pool.free.remove((base, seg))
                del pool.segments[base]
                assert cu.cuMemFree_v2(base) == 0
        if pid in self.freeable and not pool.segments:
            del self.pools[pid]
            self.freeable.discard(pid)

    def empty_cache(self):
        if not self.routes:
            self.release_free_segments((0, 0))
        for pid in list(self.freeable):
            self.release_free_segments(pid)


def make_torch(backend="native", devices=1):
    """A torch module with what vmmshim/_pools.py uses, over one
    CachingAllocator per device (as PyTorch has)."""
    allocators = [CachingAllocator(d) for d in range(devices)]
    alloc = allocators[0]
    counter = [0]
    state = threading.local()
    torch = types.ModuleType("torch")
    torch.allocator = alloc
    torch.allocators = allocators
    torch.capturing = False
    torch.crashes, torch.ended = [], []

    def current():
        return getattr(state, "device", 0)

    class MemPool:
        """~MemPool empties the pool's cache, which asserts that no route is
        open (PyTorch's synchronize_and_free_events)."""

        def __init__(self):
            counter[0] += 1
            self.id = (0, counter[0])
            self.device = current()
            allocators[self.device].create_or_incref(self.id)
            weakref.finalize(self, MemPool.destroy, self.id, self.device)

        @staticmethod
        def destroy(pid, device):
            if allocators[device].routes:
                torch.crashes.append("captures_underway.empty() INTERNAL ASSERT FAILED")
            allocators[device].release(pid)
            torch.ended.append(pid)

    def graph_pool_handle():
        counter[0] += 1
        return (counter[0], 0)

    def begin_thread(d, pid):
        tid = threading.get_ident()
        allocators[d].begin(pid, lambda t: t == tid)

    class device:
        def __init__(self, d):
            self.d = d

        def __enter__(self):
            self.saved = current()
            state.device = self.d

        def __exit__(self, *exc):
            state.device = self.saved

    def empty_cache():
        for a in allocators:
            a.empty_cache()

    def malloc(size):
        """An allocation on the current device."""
        return allocators[current()].malloc(size)

    torch.malloc = malloc
    cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: devices,
        current_device=current, is_current_stream_capturing=lambda: torch.capturing,
        MemPool=MemPool, graph_pool_handle=graph_pool_handle, empty_cache=empty_cache,
        device=device, memory=types.SimpleNamespace(get_allocator_backend=lambda: backend))
    workspace = {}

    def clear_workspaces():
        if "ptr" in workspace:
            alloc.free(workspace.pop("ptr"))

    def matmul():
        """cuBLAS: a workspace block kept for good once taken."""
        if "ptr" not in workspace:
            workspace["ptr"] = alloc.malloc(1 * MIB)
        return touch(workspace["ptr"], 1 * MIB)

    torch.matmul = matmul

    class GeneratorState:
        def __init__(self, seed=0, offset=0):
            self.seed, self.offset, self.extragraph = seed, offset, None

    class Generator:
        """torch.Generator's graph-safe API over a state whose graph RNG
        tensors are made at the first capture and written at every one."""

        def __init__(self, state=None):
            self.state = state or GeneratorState()

        def graphsafe_get_state(self):
            return Generator(self.state)

        def graphsafe_set_state(self, other):
            self.state = other.state

        def clone_state(self):
            return Generator(GeneratorState(self.state.seed, self.state.offset))

        def initial_seed(self):
            return self.state.seed

        def manual_seed(self, seed):
            self.state.seed, self.state.offset = seed, 0

        def get_offset(self):
            return self.state.offset

        def set_offset(self, offset):
            self.state.offset = offset

    def capture():
        """A CUDA graph capture's prologue: the RNG tensors, written."""
        st = cuda.default_generators[0].state
        if st.extragraph is None:
            st.extragraph = alloc.malloc(16)
        st.offset += 4
        return touch(st.extragraph, 16)

    torch.capture = capture
    torch._C = types.SimpleNamespace(
        _cuda_beginAllocateToPool=lambda d, pid: allocators[d].begin(pid, lambda t: True),
        _cuda_beginAllocateCurrentThreadToPool=begin_thread,
        _cuda_endAllocateToPool=lambda d, pid: allocators[d].end(pid),
        _cuda_releasePool=lambda d, pid: allocators[d].release(pid),
        _cuda_hasPrimaryContext=lambda d: d < devices,
        _cuda_clearCublasWorkspaces=clear_workspaces)
    cuda.default_generators = [Generator() for _ in range(devices)]
    torch.cuda = cuda
    return torch


def make_cupy():
    cupy = types.ModuleType("cupy")

    class MemoryPool:
        """Owns its chunks: an allocation holds it only weakly, and a pool
        that goes frees every chunk, live blocks included (as CuPy's)."""

        def __init__(self):
            self.pool = Pool()
            self.blocks = {}
            weakref.finalize(self, MemoryPool.free_everything, self.pool)

        @staticmethod
        def free_everything(pool):
            for base in pool.segments:
                cu.cuMemFree_v2(base)

        def malloc(self, size):
            ptr = self.pool.take(size)
            if ptr is None:
                seg = max(SEGMENT, size)
                base = driver_alloc(seg)
                self.pool.segments[base] = seg
                self.pool.free.append((base, seg))
                ptr = self.pool.take(size)
            self.blocks[ptr] = size
            return Pointer(self, ptr, size)

        def free(self, ptr):
            self.pool.free.append((ptr, self.blocks.pop(ptr)))

        def free_all_blocks(self):
            for base, seg in list(self.pool.segments.items()):
                if (base, seg) in self.pool.free:
                    self.pool.free.remove((base, seg))
                    del self.pool.segments[base]
                    assert cu.cuMemFree_v2(base) == 0

    class Pointer:
        def __init__(self, pool, ptr, size):
            self.pool_ref, self.ptr, self.size = weakref.ref(pool), ptr, size

        @property
        def pool(self):
            return self.pool_ref()

        def free(self):
            pool = self.pool_ref()
            if pool is not None:
                pool.free(self.ptr)

    default = MemoryPool()
    current = [default.malloc]
    local = threading.local()

    def set_allocator(a):
        if getattr(local, "allocator", None) is not None:
            raise ValueError("Can't change the global allocator inside `using_allocator`")
        current[0] = a

    cupy.get_default_memory_pool = lambda: default
    cupy.cuda = types.SimpleNamespace(MemoryPool=MemoryPool, set_allocator=set_allocator,
                                      get_allocator=lambda: current[0],
                                      device=types.SimpleNamespace(get_cublas_handle=lambda: 7))
    cupy.alloc = lambda size: current[0](size)
    # cuBLAS's workspace setter (cupy_backends.cuda.libs.cublas.setWorkspace).
    cupy.workspaces = {}
    names = ["cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs",
             "cupy_backends.cuda.libs.cublas"]
    mods = [types.ModuleType(n) for n in names]
    for parent, child, name in zip(mods, mods[1:], ["cuda", "libs", "cublas"]):
        setattr(parent, name, child)
    mods[-1].setWorkspace = lambda h, ptr, size: cupy.workspaces.__setitem__(h, (ptr, size))
    sys.modules.update(zip(names, mods))
    return cupy


import vmmshim  # noqa: E402  (after the driver is loaded)
from vmmshim import _pools  # noqa: E402


class FrameworkPoolsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        assert cu.cuInit(0) == 0
        for d in (0, 1):
            ctx = ctypes.c_void_p()
            assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d) == 0
            CONTEXTS[d] = ctx
        assert cu.cuCtxSetCurrent(CONTEXTS[0]) == 0
        cls.ctx = CONTEXTS[0]
        assert vmmshim.loaded()

    def setUp(self):
        for name in ("torch", "cupy", "jax", "rmm", "cupy_backends",
                     "cupy_backends.cuda", "cupy_backends.cuda.libs",
                     "cupy_backends.cuda.libs.cublas"):
            sys.modules.pop(name, None)
        _pools._torch = None
        _pools._cupy = None
        _pools._warned_unsafe.clear()

    def tearDown(self):
        vmmshim.resume()
        for name in ("torch", "cupy"):
            sys.modules.pop(name, None)

    def with_torch(self, backend="native", devices=1):
        torch = make_torch(backend, devices)
        sys.modules["torch"] = torch
        return torch, torch.allocator

    def holes(self, a, n=8, size=256 * 1024):
        """Allocations with every other one freed: free blocks inside the
        pool's segments."""
        ptrs = [a.malloc(size) for _ in range(n)]
        for p in ptrs[::2]:
            a.free(p)
        return ptrs[1::2]

    def test_pausing_a_tag_leaves_other_pools_whole_and_its_free_space_unused(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):
            kv_live = self.holes(a)
        untagged_live = self.holes(a)
        kv_pool = a.blocks[kv_live[0]][0]
        self.assertNotEqual(kv_pool, (0, 0))  # the tag's own pool
        self.assertGreater(vmmshim.pause("kv"), 0)
        self.assertFalse(touch(kv_live[0], 256 * 1024))      # paused
        self.assertTrue(touch(untagged_live[0], 256 * 1024))  # not the default pool
        for _ in range(16):  # untagged work: the default pool, never kv's holes
            p = a.malloc(200 * 1024)
            self.assertTrue(touch(p, 200 * 1024))
        with vmmshim.tag("kv"):  # the paused tag: a pool of the block's own
            p = a.malloc(100 * 1024)
            self.assertNotEqual(a.blocks[p][0], kv_pool)
            self.assertTrue(touch(p, 100 * 1024))
        self.assertEqual(a.routes, [])  # no pause pool was needed
        self.assertGreater(vmmshim.resume("kv"), 0)
        self.assertTrue(touch(kv_live[0], 256 * 1024))
        with vmmshim.tag("kv"):  # the tag's pool again, holes and all
            self.assertEqual(a.blocks[a.malloc(1024)][0], kv_pool)

    def test_pausing_everything_routes_every_allocation_to_a_pause_pool(self):
        torch, a = self.with_torch()
        live = self.holes(a, n=16)
        self.assertTrue(torch.matmul())  # cuBLAS's workspace, in the default pool
        self.assertTrue(torch.capture())  # a graph: its RNG tensors, in the default pool
        kept_state = torch.cuda.default_generators[0].state
        with vmmshim.tag("weights"):
            weights = self.holes(a)
        self.assertGreater(vmmshim.pause(except_tags=["weights"], keep_contents=False), 0)
        self.assertFalse(touch(live[0], 256 * 1024))
        self.assertTrue(torch.matmul())  # a new workspace, from the pause pool
        self.assertTrue(torch.capture())  # the graph RNG state: a fresh one
        sizes = [512, 4096, 100 * 1024, 256 * 1024, 3 * MIB]
        made = [a.malloc(s) for s in sizes * 4]
        for p, s in zip(made, sizes * 4):
            self.assertTrue(touch(p, s), "an allocation landed in paused memory")
        for p in made[::2]:
            a.free(p)
        with vmmshim.tag("weights"):  # a tag that is not paused: its own pool
            w = a.malloc(1024)
            self.assertEqual(a.blocks[w][0], a.blocks[weights[0]][0])
        # A phase that fits only while paused, freed before the resume.
        big = a.malloc(40 * MIB)
        self.assertTrue(touch(big, 40 * MIB))
        a.free(big)
        pause_pool = a.blocks[made[1]][0]
        self.assertIn(pause_pool, a.pools)
        self.assertGreater(vmmshim.resume(), 0)
        # The pause pool's free segments went back before the resume; its
        # live blocks stay valid, and new allocations use the default pool.
        self.assertEqual(a.routes, [])
        self.assertNotIn(pause_pool, [r[0] for r in a.routes])
        self.assertTrue(all(seg < 40 * MIB for seg in a.pools[pause_pool].segments.values()))
        self.assertTrue(touch(made[1], sizes[1]))
        self.assertEqual(a.blocks[a.malloc(1024)][0], (0, 0))
        self.assertTrue(touch(live[0], 256 * 1024))
        # The kept RNG state is back, with the offset the paused time reached.
        self.assertIs(torch.cuda.default_generators[0].state, kept_state)
        self.assertEqual(kept_state.offset, 8)
        self.assertTrue(torch.capture())

    def test_a_resume_short_of_memory_gets_the_framework_cache_back(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):
            kv = a.malloc(32 * MIB)
        self.assertGreater(vmmshim.pause("kv"), 0)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.assertEqual(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), 0)
        # A phase in the untagged (unpaused) pool takes what the pause gave,
        # and stays in PyTorch's cache once freed.
        big = a.malloc(free.value - 16 * MIB)
        self.assertTrue(touch(big, 1 * MIB))
        a.free(big)
        self.assertGreater(vmmshim.resume("kv"), 0)
        self.assertTrue(touch(kv, 32 * MIB))
        self.assertFalse(any(seg > 64 * MIB for seg in a.pools[(0, 0)].segments.values()))

    def test_a_program_pool_that_ends_while_paused_ends_after_the_resume(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):  # makes the routing ready
            pass
        self.holes(a)
        vmmshim.pause()
        own = torch.cuda.MemPool()  # a phase in a pool of the program's own
        pid = own.id
        del own
        self.assertEqual(torch.crashes, [])
        self.assertNotIn(pid, torch.ended)  # kept while the pause pool is routed
        vmmshim.resume()
        self.assertIn(pid, torch.ended)
        self.assertEqual(torch.crashes, [])

    def test_a_thread_inside_a_tag_across_the_pause_gets_unpaused_memory(self):
        torch, a = self.with_torch()
        entered, paused, done = threading.Event(), threading.Event(), threading.Event()
        results = []

        def worker():
            cu.cuCtxSetCurrent(self.ctx)
            with vmmshim.tag("kv"):
                self.holes(a)
                entered.set()
                paused.wait(10)
                for _ in range(8):
                    p = a.malloc(128 * 1024)
                    results.append(touch(p, 128 * 1024))
            done.set()

        t = threading.Thread(target=worker)
        t.start()
        self.assertTrue(entered.wait(10))
        # Another thread in the same tag meanwhile: its own pool, no error.
        with vmmshim.tag("kv"):
            self.assertTrue(touch(a.malloc(4096), 4096))
        vmmshim.pause("kv")
        paused.set()
        self.assertTrue(done.wait(10))
        t.join()
        self.assertEqual(results, [True] * 8)
        vmmshim.resume("kv")
        self.assertEqual(a.routes, [])

    def test_nested_tags_captures_and_the_async_backend(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):
            with vmmshim.tag("kv"):  # nested: one route, no "already recording"
                self.assertEqual(len(a.routes), 1)
            with vmmshim.tag("w"):
                self.assertEqual(len(a.routes), 2)
            torch.capturing = True  # inside a capture the graph's pool takes them
            with vmmshim.tag("x"):
                self.assertEqual(len(a.routes), 1)
            torch.capturing = False
        self.assertEqual(a.routes, [])
        # backend:cudaMallocAsync: the shim is the allocator; nothing routed.
        self.setUp()
        torch, a = self.with_torch("cudaMallocAsync")
        with vmmshim.tag("kv"):
            self.assertEqual(a.routes, [])
        vmmshim.pause()
        self.assertEqual(a.routes, [])

    def call_with(self, name, before):
        """vmmshim's C calls, with `before()` run just ahead of `name`."""
        real = vmmshim._call

        def call(n, *args):
            if n == name:
                before()
            return real(n, *args)

        vmmshim._call = call
        self.addCleanup(setattr, vmmshim, "_call", real)

    def test_an_allocation_during_the_pause_call_does_not_poison_the_pause_pool(self):
        torch, a = self.with_torch()
        self.holes(a)
        gap = []
        # Another thread's allocation between the routing and the shim's pause.
        self.call_with("vmmshim_pause_memory", lambda: gap.append(a.malloc(64 * 1024)))
        vmmshim.pause()
        a.free(gap[0])
        for _ in range(8):
            p = a.malloc(64 * 1024)
            self.assertTrue(touch(p, 64 * 1024), "an allocation landed in paused memory")

    def test_a_failed_pause_undoes_the_routing(self):
        torch, a = self.with_torch()
        self.holes(a)
        seen = []

        def fail():  # the shim's pause fails (a driver error), after the routing
            seen.append((len(a.routes), torch.cuda.default_generators[0].state))
            raise vmmshim.VmmshimError("vmmshim_pause_memory_except", 1)

        self.call_with("vmmshim_pause_memory_except", fail)
        kept = torch.cuda.default_generators[0].state
        with self.assertRaises(vmmshim.VmmshimError):
            vmmshim.pause(except_tags=["w"])
        self.assertEqual(seen[0][0], 1)               # the pause pool was routed
        self.assertIsNot(seen[0][1], kept)            # and the graph RNG swapped
        self.assertIs(torch.cuda.default_generators[0].state, kept)
        with self.assertRaises(ValueError):
            vmmshim.pause("kv", except_tags=["w"])
        self.assertEqual(a.routes, [])
        self.assertEqual(_pools._torch[1].paused, set())

    def test_cupy_default_pool(self):
        cupy = make_cupy()
        sys.modules["cupy"] = cupy
        default = cupy.get_default_memory_pool()
        live = [cupy.alloc(256 * 1024) for _ in range(8)]
        with vmmshim.tag("kv"):
            kv = [cupy.alloc(256 * 1024) for _ in range(8)]
        self.assertIsNot(kv[0].pool, default)  # the tag's own pool
        for p in live[::2] + kv[::2]:
            p.free()
        self.assertGreater(vmmshim.pause(), 0)
        ptr, size = cupy.workspaces[7]  # cuBLAS works in unpaused memory
        self.assertTrue(touch(ptr, size))
        made = [cupy.alloc(s) for s in (512, 100 * 1024, 256 * 1024, 3 * MIB)]
        self.assertTrue(all(touch(p.ptr, p.size) for p in made))
        self.assertTrue(all(p.pool is not default for p in made))
        with vmmshim.tag("kv"):
            k = cupy.alloc(256 * 1024)
            self.assertIsNot(k.pool, kv[0].pool)
            self.assertTrue(touch(k.ptr, k.size))
        big = cupy.alloc(40 * MIB)
        self.assertTrue(touch(big.ptr, big.size))
        big.free()
        pause_pool = made[0].pool
        self.assertGreater(vmmshim.resume(), 0)
        self.assertEqual(list(pause_pool.pool.segments.values()).count(40 * MIB), 0)
        # What was made while paused stays valid (its pool is kept), and so
        # does cuBLAS's workspace.
        del pause_pool
        self.assertTrue(all(touch(p.ptr, p.size) for p in made))
        self.assertTrue(touch(*cupy.workspaces[7]))
        self.assertIs(cupy.alloc(1024).pool, default)
        with vmmshim.tag("kv"):
            self.assertIs(cupy.alloc(1024).pool, kv[0].pool)
        self.assertTrue(touch(live[1].ptr, live[1].size))

    def test_cupy_pausing_everything_twice(self):
        cupy = make_cupy()
        sys.modules["cupy"] = cupy
        with vmmshim.tag("w"):
            cupy.alloc(1024)  # the allocator takes the default pool's place
        vmmshim.pause()
        first = [cupy.alloc(100 * 1024) for _ in range(4)]
        first[0].free()
        vmmshim.pause()  # the first pause pool is paused too now
        again = [cupy.alloc(100 * 1024) for _ in range(4)]
        self.assertTrue(all(touch(p.ptr, p.size) for p in again))
        self.assertFalse(touch(first[1].ptr, first[1].size))
        vmmshim.resume()
        self.assertTrue(all(touch(p.ptr, p.size) for p in first[1:] + again))

    def test_a_pause_pool_that_served_a_tag_is_not_used_once_that_tag_is_paused(self):
        torch, a = self.with_torch()
        self.holes(a)
        entered, go, done = threading.Event(), threading.Event(), threading.Event()

        def worker():
            cu.cuCtxSetCurrent(self.ctx)
            with vmmshim.tag("kv"):
                entered.set()
                go.wait(10)
                a.free(a.malloc(256 * 1024))  # a kv segment in the pause pool
            done.set()

        t = threading.Thread(target=worker)
        t.start()
        self.assertTrue(entered.wait(10))
        vmmshim.pause()
        go.set()
        self.assertTrue(done.wait(10))
        t.join()
        vmmshim.pause("kv")  # pauses that segment, inside the pause pool
        for _ in range(8):
            p = a.malloc(200 * 1024)
            self.assertTrue(touch(p, 200 * 1024), "an allocation landed in paused memory")

    def test_a_block_of_its_own_is_paused_again_safely(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):
            a.malloc(4096)  # the tag's pool
        vmmshim.pause("kv")
        inside, paused_again, done = threading.Event(), threading.Event(), threading.Event()
        results = []

        def worker():
            cu.cuCtxSetCurrent(self.ctx)
            with vmmshim.tag("kv"):  # a pool of its own: kv is paused
                a.free(a.malloc(256 * 1024))
                inside.set()
                paused_again.wait(10)
                for _ in range(4):
                    p = a.malloc(200 * 1024)
                    results.append(touch(p, 200 * 1024))
            done.set()

        t = threading.Thread(target=worker)
        t.start()
        self.assertTrue(inside.wait(10))
        vmmshim.resume("kv")
        vmmshim.pause("kv")  # the block's own pool holds kv memory: paused too
        paused_again.set()
        self.assertTrue(done.wait(10))
        t.join()
        self.assertEqual(results, [True] * 4)

    def test_nested_tags_keep_one_tag_per_pool(self):
        torch, a = self.with_torch()
        with vmmshim.tag("a"):
            with vmmshim.tag("b"):
                b = a.malloc(100 * 1024)
                with vmmshim.tag("a"):
                    inner = a.malloc(100 * 1024)
                with vmmshim.tag(None):
                    untagged = a.malloc(100 * 1024)
        self.assertNotEqual(a.blocks[inner][0], a.blocks[b][0])
        self.assertNotEqual(a.blocks[untagged][0], a.blocks[b][0])
        vmmshim.pause("b")
        self.assertFalse(touch(b, 100 * 1024))
        self.assertTrue(touch(inner, 100 * 1024))
        self.assertTrue(touch(untagged, 100 * 1024))
        self.assertEqual(a.routes, [])

    def test_every_device_with_a_context_is_routed(self):
        torch, a = self.with_torch(devices=2)
        a1 = torch.allocators[1]
        with torch.cuda.device(1):
            live = [a1.malloc(256 * 1024) for _ in range(4)]
            a1.free(live[0])
        with vmmshim.tag("kv"):  # current device 0; an allocation on device 1
            with torch.cuda.device(1):
                kv = torch.malloc(256 * 1024)
        self.assertNotEqual(a1.blocks[kv][0], (0, 0))  # the tag's pool on device 1
        vmmshim.pause("kv")
        cu.cuCtxSetCurrent(CONTEXTS[1])
        self.assertFalse(touch(kv, 256 * 1024))
        with torch.cuda.device(1):
            for _ in range(8):
                p = torch.malloc(200 * 1024)
                self.assertTrue(touch(p, 200 * 1024))
        cu.cuCtxSetCurrent(CONTEXTS[0])

    def test_pausing_everything_twice_keeps_the_graph_rng_state(self):
        torch, a = self.with_torch()
        self.holes(a)
        self.assertTrue(torch.capture())
        kept = torch.cuda.default_generators[0].state
        vmmshim.pause()
        self.assertTrue(torch.capture())
        vmmshim.pause()
        self.assertTrue(torch.capture())  # a fresh state again: the last one is paused
        vmmshim.resume()
        self.assertIs(torch.cuda.default_generators[0].state, kept)
        self.assertEqual(kept.offset, 12)

    def test_a_resume_that_fails_early_leaves_the_routing_as_it_was(self):
        torch, a = self.with_torch()
        entered, go = threading.Event(), threading.Event()

        def worker():
            cu.cuCtxSetCurrent(self.ctx)
            with vmmshim.tag("kv"):
                a.malloc(4096)
                entered.set()
                go.wait(10)

        t = threading.Thread(target=worker)
        t.start()
        self.assertTrue(entered.wait(10))
        vmmshim.pause("kv")  # a thread in the tag: a pause pool
        go.set()
        t.join()
        routes = list(a.routes)
        self.assertEqual(len(routes), 1)
        with self.assertRaises(TypeError):
            vmmshim.resume(b"kv")  # not a str
        self.assertEqual(a.routes, routes)
        self.assertEqual(_pools._torch[1].resuming, {})

    def test_allocators_the_shim_cannot_see_into_are_named_once(self):
        sys.modules["jax"] = types.ModuleType("jax")
        os.environ.pop("XLA_PYTHON_CLIENT_ALLOCATOR", None)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            vmmshim.pause("nothing-has-this-tag")
            vmmshim.pause("nothing-has-this-tag")
        messages = [str(w.message) for w in seen]
        self.assertEqual(len(messages), 1, messages)
        self.assertIn("JAX's BFC arena", messages[0])
        self.assertIn("XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async", messages[0])
        self.assertEqual(seen[0].filename, __file__)
        os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "cuda_async"
        try:
            self.assertEqual(_pools.unsafe_allocators(), [])
        finally:
            del os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"]
        # A PyTorch whose caching allocator cannot be routed.
        torch = make_torch()
        del torch._C._cuda_beginAllocateToPool
        sys.modules["torch"] = torch
        sys.modules.pop("jax")
        _pools._torch = None
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            vmmshim.pause("nothing-has-this-tag")
        self.assertEqual(len(seen), 1)
        self.assertIn("no MemPool routing", str(seen[0].message))
        self.assertIn("backend:cudaMallocAsync", str(seen[0].message))
        sys.modules.pop("torch")
        sys.modules["jax"] = types.ModuleType("jax")
        # A CuPy allocator of the program's own.
        cupy = make_cupy()
        own = cupy.cuda.MemoryPool()
        cupy.cuda.set_allocator(own.malloc)
        sys.modules["cupy"] = cupy
        sys.modules.pop("jax")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            vmmshim.pause("nothing-has-this-tag")
        self.assertEqual(len(seen), 1)
        self.assertIn("a CuPy allocator of the program's own", str(seen[0].message))

    def test_a_lost_context_is_said_in_words(self):
        e = vmmshim.VmmshimError("vmmshim_resume_memory", 700)
        self.assertIn("CUDA_ERROR_ILLEGAL_ADDRESS", str(e))
        self.assertIn("the CUDA context is lost", str(e))
        self.assertEqual(e.code, 700)
        self.assertNotIn("context is lost", str(vmmshim.VmmshimError("x", 2)))


if __name__ == "__main__":
    unittest.main()

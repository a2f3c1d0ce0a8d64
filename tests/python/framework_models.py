"""Models of the framework allocators that vmmshim's framework pools
(python/vmmshim/_pools.py) rely on, over real shim memory on the simulated
driver, and the base of the tests that use them (test_torch_pools.py,
test_cupy_pools.py).

PyTorch and CuPy cannot run on the simulated driver, so their allocators'
rules are modelled here, small and strict, over real shim allocations
(cuMemAlloc through libvmmshim.so on the simulated libcuda.so.1, so that a
pause really unmaps them and a touch of paused memory really fails):
  PyTorch's caching allocator, one per device: segments from cudaMalloc,
  freed blocks kept per pool and handed out again (best fit); routes
  searched newest first (`captures_underway`), one route per pool ("already
  recording to mempool_id"); MemPool and graph_pool_handle ids; use counts,
  a pool that reaches 0 is freeable and cannot be routed again; empty_cache
  releases the default pool only without routes, and freeable pools' wholly
  free segments always; ~MemPool asserts that no route is open;
  clearCublasWorkspaces frees a block; the generator's graph-safe API over
  RNG tensors made at the first capture.
  CuPy: set_allocator / get_allocator (refused inside using_allocator), the
  default MemoryPool, pools that own their chunks and are held weakly by
  allocations, MemoryPool.malloc / free_all_blocks, cuBLAS's setWorkspace.
The real frameworks are checked on a GPU (tests/gpu/gpu_check.sh safe_pause).
Runs under LD_PRELOAD=libvmmshim.so with LD_LIBRARY_PATH at the simulated
driver (2 devices)."""
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
        """Best fit, split."""
        fits = sorted((s, p) for p, s in self.free if s >= size)
        if not fits:
            return None
        s, p = fits[0]
        self.free.remove((p, s))
        if s > size:
            self.free.append((p + size, s - size))
        return p

    def give(self, ptr, size):
        """A freed block back, merged with its free neighbours in its segment
        (so a segment whose blocks are all free is one free block again)."""
        base = next(b for b, n in self.segments.items() if b <= ptr < b + n)
        end = base + self.segments[base]
        merged = True
        while merged:
            merged = False
            for p, n in list(self.free):
                if p + n == ptr and p >= base:
                    self.free.remove((p, n))
                    ptr, size, merged = p, size + n, True
                elif ptr + size == p and p + n <= end:
                    self.free.remove((p, n))
                    size, merged = size + n, True
        self.free.append((ptr, size))


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
        self.pools[pid].give(ptr, size)

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
                seg = (size + 511) // 512 * 512  # CuPy asks the driver for what it needs
                base = driver_alloc(seg)
                self.pool.segments[base] = seg
                self.pool.free.append((base, seg))
                ptr = self.pool.take(size)
            self.blocks[ptr] = size
            return Pointer(self, ptr, size)

        def free(self, ptr):
            self.pool.give(ptr, self.blocks.pop(ptr))

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


class PoolsTest(unittest.TestCase):
    """Sets up the simulated devices and resets the pools between tests."""
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

    def call_with(self, name, before):
        """vmmshim's C calls (vmmshim/_library.py), with `before()` run just
        ahead of `name`."""
        from vmmshim import _library
        real = _library.call

        def call(n, *args):
            if n == name:
                before()
            return real(n, *args)

        _library.call = call
        self.addCleanup(setattr, _library, "call", real)

    def in_tag_on_a_thread(self, tag, first, then):
        """Starts a thread that enters vmmshim.tag(tag) and runs first(); once
        that is done, returns finish(): it lets the thread run then() inside
        the same tag, waits for it, and returns then()'s result."""
        entered, go, box = threading.Event(), threading.Event(), []

        def worker():
            cu.cuCtxSetCurrent(self.ctx)
            with vmmshim.tag(tag):
                first()
                entered.set()
                go.wait(10)
                box.append(then())

        t = threading.Thread(target=worker)
        t.start()
        self.assertTrue(entered.wait(10))

        def finish():
            go.set()
            t.join(10)
            self.assertFalse(t.is_alive())
            self.assertEqual(len(box), 1, "the thread failed")
            return box[0]

        return finish


def random_pause_or_resume(rng, op):
    """One random step of the sequences: a pause of any kind of selection
    (one tag, the untagged, everything, everything but one tag; contents kept
    or not) when op < 0.9, else a resume of everything or of one tag."""
    if op >= 0.9:
        vmmshim.resume(rng.choice([None, "a", "b", ""]))
        return
    kind = rng.choice(["a", "b", "", None, "except"])
    keep = rng.random() < 0.5
    if kind == "except":
        vmmshim.pause(except_tags=[rng.choice(["a", "b"])], keep_contents=keep)
    else:
        vmmshim.pause(kind, keep_contents=keep)

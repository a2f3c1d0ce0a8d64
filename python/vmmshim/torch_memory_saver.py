"""torch_memory_saver's Python API, served by vmmshim: a program written for
torch_memory_saver runs unchanged when `import torch_memory_saver` resolves
here, which one line arranges:

    vmmshim run --torch-memory-saver -- python3 your_program.py

(it preloads libvmmshim.so and libvmmshim_tms.so, torch_memory_saver's C
entry points served by vmmshim, and puts vmmshim/_tms, whose
torch_memory_saver package is this module, first on PYTHONPATH).

What maps to what (docs/torch-memory-saver.md):
- region(tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
  a PyTorch MemPool per (tag, cpu backup, disk backup, backend, device), as
  torch_memory_saver keeps in `_impl._mem_pools`, and the region state of
  libvmmshim_tms.so on the thread (interpose/torch_memory_saver/
  tms_entry_points.cc), which tags the allocations "tms:TAG[:...]" so that
  a pause reaches exactly them.
- pause(tag) / resume(tag): tms_pause / tms_resume of libvmmshim_tms.so:
  vmmshim_pause_memory of those tags, contents kept as each region asked
  (pinned, mmap or disk); retain_cpu_backup keeps the host copies across
  resumes at their addresses (vmmshim_resume_memory_retaining_contents).
- get_cpu_backup(x): the shim's host copy (vmmshim_get_paused_contents).
- TMS_INIT_ENABLE, TMS_INIT_ENABLE_CPU_BACKUP, TMS_INIT_CPU_BACKUP_BACKEND,
  TMS_RETAIN_CPU_BACKUP: read by libvmmshim_tms.so, as torch_memory_saver's
  library reads them.
"""
import contextlib
import ctypes
import os
import sys
import types
from typing import Optional

import vmmshim
from vmmshim import _library

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess", "is_xpu"]

_TAG_DEFAULT = "default"
_TMS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tms")
_BACKENDS = (None, "pinned", "mmap")


def _torch():
    # Imported late: `import torch_memory_saver` must not need CUDA yet.
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(f"torch_memory_saver (served by vmmshim) needs PyTorch: {e}") from e
    return torch


def is_xpu() -> bool:
    """Whether PyTorch runs on Intel XPU here (torch_memory_saver's check;
    vmmshim serves CUDA only)."""
    torch = sys.modules.get("torch")
    xpu = getattr(torch, "xpu", None) if torch is not None else None
    try:
        return bool(xpu is not None and xpu.is_available())
    except Exception:  # noqa: BLE001: a build whose xpu module cannot answer
        return False


def _loaded_tms_library():
    """The libvmmshim_tms.so mapped into this process (preloaded), or None."""
    return _library.mapped_library(_library.TMS_LIBRARY)


tms_library_path = _library.tms_library_path


class _Library(ctypes.CDLL):
    """libvmmshim_tms.so, as torch_memory_saver's `_binary_wrapper.cdll`:
    the getters return what torch_memory_saver's do (bytes, bool); a name it
    lacks (cudaHostGetFlags, cudaGetLastError: cudart's, which
    torch_memory_saver's library links) comes from the cudart PyTorch loaded."""

    def __init__(self, path):
        super().__init__(path)
        for name in ("tms_get_current_tag", "tms_get_cpu_backup_backend"):
            getattr(self, name).restype = ctypes.c_char_p
        for name in ("tms_get_interesting_region", "tms_get_enable_cpu_backup",
                     "tms_get_enable_disk_backup", "tms_get_retain_cpu_backup"):
            getattr(self, name).restype = ctypes.c_bool
        for name in ("tms_set_interesting_region", "tms_set_enable_cpu_backup",
                     "tms_set_enable_disk_backup", "tms_set_retain_cpu_backup"):
            getattr(self, name).argtypes = [ctypes.c_bool]
        for name in ("tms_set_current_tag", "tms_set_cpu_backup_backend", "tms_pause",
                     "tms_resume"):
            getattr(self, name).argtypes = [ctypes.c_char_p]
        self.tms_set_disk_backup_dir.argtypes = [ctypes.c_char_p]

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__"):
                raise
        function = getattr(_cudart(), name)
        setattr(self, name, function)
        return function


def _cudart():
    """The cudart mapped into this process (PyTorch's), else the process's
    global symbols."""
    path = _library.mapped_library("libcudart.so", prefix=True)
    return ctypes.CDLL(path)


class _Impl:
    """torch_memory_saver's `_impl`: the C side and the MemPools of regions."""

    def __init__(self):
        self._binary_wrapper = types.SimpleNamespace(cdll=_Library(tms_library_path()))
        # (tag, enable_cpu_backup, enable_disk_backup, backend, device) -> MemPool
        self._mem_pools = {}

    @property
    def _c(self):
        return self._binary_wrapper.cdll

    @contextlib.contextmanager
    def _with_region_config(self, tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False,
                            enable_disk_backup: bool = False,
                            cpu_backup_backend: Optional[str] = None, interesting: bool = True):
        """The thread's region state for the block (restored after): what
        the allocations made inside are tagged with."""
        c = self._c
        saved = (c.tms_get_interesting_region(), c.tms_get_enable_cpu_backup(),
                 c.tms_get_enable_disk_backup(), c.tms_get_current_tag(),
                 c.tms_get_cpu_backup_backend())
        c.tms_set_current_tag(tag.encode())
        c.tms_set_enable_cpu_backup(bool(enable_cpu_backup))
        c.tms_set_enable_disk_backup(bool(enable_disk_backup))
        c.tms_set_cpu_backup_backend((cpu_backup_backend or "pinned").encode())
        c.tms_set_interesting_region(bool(interesting))
        try:
            yield
        finally:
            c.tms_set_current_tag(saved[3])
            c.tms_set_enable_cpu_backup(saved[1])
            c.tms_set_enable_disk_backup(saved[2])
            c.tms_set_cpu_backup_backend(saved[4])
            c.tms_set_interesting_region(saved[0])

    def pool(self, key):
        pool = self._mem_pools.get(key)
        if pool is None:
            pool = self._mem_pools[key] = _torch().cuda.MemPool()
        return pool

    def check(self, call):
        rc = self._c.vmmshim_tms_last_error()
        if rc != 0:
            raise vmmshim.VmmshimError(call, rc)


class TorchMemorySaver:
    """The torch_memory_saver singleton's class (one per process is meant)."""

    def __init__(self):
        self._impl_ = None

    # ---- regions ----
    @contextlib.contextmanager
    def region(self, tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False,
               enable_disk_backup: bool = False, cpu_backup_backend: Optional[str] = None):
        """Allocations made inside can be paused by `tag`; with a backup
        (cpu or disk) their contents come back at resume."""
        self._check_backup(enable_cpu_backup, cpu_backup_backend)
        impl = self._ensure_initialized()
        torch = _torch()
        backend = cpu_backup_backend or "pinned"
        key = (tag, bool(enable_cpu_backup), bool(enable_disk_backup), backend,
               torch.cuda.current_device())
        with impl._with_region_config(tag=tag, enable_cpu_backup=enable_cpu_backup,
                                      enable_disk_backup=enable_disk_backup,
                                      cpu_backup_backend=backend):
            with torch.cuda.use_mem_pool(impl.pool(key)):
                yield

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global",
                   tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False,
                   cpu_backup_backend: Optional[str] = None):
        """torch.cuda.graph(...), with the memory the capture allocates (the
        graph's private pool) in the region `tag`."""
        self._check_backup(enable_cpu_backup, cpu_backup_backend)
        impl = self._ensure_initialized()
        torch = _torch()
        with torch.cuda.graph(cuda_graph, pool=pool, stream=stream,
                              capture_error_mode=capture_error_mode):
            with impl._with_region_config(tag=tag, enable_cpu_backup=enable_cpu_backup,
                                          cpu_backup_backend=cpu_backup_backend):
                yield

    @contextlib.contextmanager
    def disable(self):
        """Allocations inside are outside every region (never paused), from a
        fresh MemPool given back at the end, with the shim's cache of it."""
        impl = self._ensure_initialized()
        torch = _torch()
        pool = torch.cuda.MemPool()
        try:
            with impl._with_region_config(interesting=False), torch.cuda.use_mem_pool(pool):
                yield
        finally:
            del pool
            torch.cuda.synchronize()
            vmmshim.release_cached_memory()

    # ---- pause and resume ----
    def pause(self, tag: Optional[str] = None):
        """Releases the physical memory of the regions of `tag` (None: all),
        keeping addresses, and contents where the region asked for a backup."""
        impl = self._ensure_initialized()
        impl._c.tms_pause(tag.encode() if tag is not None else None)
        impl.check("tms_pause")

    def resume(self, tag: Optional[str] = None):
        """Maps the paused memory of `tag` (None: all) again, contents back
        where they were kept (kept on the host too with retain_cpu_backup)."""
        impl = self._ensure_initialized()
        impl._c.tms_resume(tag.encode() if tag is not None else None)
        impl.check("tms_resume")

    def get_cpu_backup(self, x, zero_copy: bool = False):
        """A CPU tensor with the kept contents of `x` (paused with a backup, or
        resumed with retain_cpu_backup); None when there are none. zero_copy:
        a view of the shim's host copy, which nothing keeps alive: valid only
        until the memory is resumed or freed (vmmshim.paused_contents)."""
        torch = _torch()
        assert x.is_cuda, f"{x.device=}"
        assert x.is_contiguous(), f"{x.shape=} {x.stride()=} {x.dtype=}"
        self._ensure_initialized()
        nbytes = x.nbytes
        address = _library.paused_address(x.data_ptr(), nbytes)
        if address is None:
            return None
        if nbytes == 0:
            return torch.empty(x.shape, dtype=x.dtype)
        raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address),
                               dtype=torch.uint8)
        out = raw.view(x.dtype).view(x.shape)
        return out if zero_copy else out.clone()

    # ---- settings ----
    @property
    def enabled(self):
        return True

    @property
    def hook_mode(self):
        raise AttributeError("hook_mode can only be set")

    @hook_mode.setter
    def hook_mode(self, mode):
        if mode not in ("preload", "torch"):
            raise ValueError(f"hook_mode must be 'preload' or 'torch', not {mode!r}")
        # Both are served by the preloaded shim (the "torch" mode's pluggable
        # allocator is not needed: every cudaMalloc already reaches it).

    @property
    def memory_margin_bytes(self):
        raise NotImplementedError("Only setter is supported")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int):
        if value < 0:
            raise ValueError("memory_margin_bytes must be 0 or more")
        self._ensure_initialized()
        lib = _library.api()
        lib.vmmshim_set_memory_margin.argtypes = [ctypes.c_size_t]
        lib.vmmshim_set_memory_margin.restype = ctypes.c_int
        rc = lib.vmmshim_set_memory_margin(value)
        if rc != 0:
            raise vmmshim.VmmshimError("vmmshim_set_memory_margin", rc)

    @property
    def retain_cpu_backup(self) -> bool:
        return bool(self._ensure_initialized()._c.tms_get_retain_cpu_backup())

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool):
        self._ensure_initialized()._c.tms_set_retain_cpu_backup(bool(value))

    def set_disk_backup_dir(self, path: str):
        """Where regions with enable_disk_backup keep their contents while
        paused: a file per allocation, removed at resume."""
        rc = self._ensure_initialized()._c.tms_set_disk_backup_dir(os.fsencode(path))
        if rc != 0:
            raise ValueError(f"set_disk_backup_dir({path!r}): not a directory this process "
                             f"can write to")

    # ---- helpers ----
    @property
    def _impl(self):
        return self._ensure_initialized()

    def _ensure_initialized(self):
        if self._impl_ is not None:
            return self._impl_
        if not vmmshim.loaded():
            raise RuntimeError(
                "torch_memory_saver (served by vmmshim): libvmmshim.so is not loaded in this "
                "process; start it with `vmmshim run --torch-memory-saver -- python3 ...`")
        if _loaded_tms_library() is None:
            raise RuntimeError(
                "torch_memory_saver (served by vmmshim): libvmmshim_tms.so is not preloaded; "
                "start the program with `vmmshim run --torch-memory-saver -- python3 ...`")
        env = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if "expandable_segments:True" in env.replace(" ", ""):
            # A MemPool's segments would be one growing mapping shared by
            # every region: a pause by tag could not tell them apart.
            raise RuntimeError(
                "torch_memory_saver regions need PYTORCH_CUDA_ALLOC_CONF without "
                "expandable_segments:True (so does torch_memory_saver itself); vmmshim's own "
                "API pauses expandable segments (vmmshim.tag, docs/pause-resume.md)")
        self._impl_ = _Impl()
        return self._impl_

    @staticmethod
    def _check_backup(enable_cpu_backup, cpu_backup_backend):
        # torch_memory_saver's checks, in its order (its tests match the words).
        if cpu_backup_backend not in _BACKENDS:
            raise ValueError(f"cpu_backup_backend must be 'pinned' or 'mmap', not "
                             f"{cpu_backup_backend!r}")
        if cpu_backup_backend is None:
            return
        if not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if is_xpu():  # looked up at the call: tests replace it on the module
            raise ValueError("cpu_backup_backend is not supported on XPU")
        if cpu_backup_backend == "mmap" and getattr(_torch().version, "hip", None):
            raise ValueError("cpu_backup_backend='mmap' is not supported on ROCm")


def configure_subprocess():
    """Processes started inside preload vmmshim's torch_memory_saver library
    and import this module as torch_memory_saver, as torch_memory_saver's
    own configure_subprocess() preloads its library."""
    if _TMS_PATH not in sys.path:
        sys.path.insert(0, _TMS_PATH)
    from torch_memory_saver.hooks import mode_preload
    return mode_preload.configure_subprocess()


# The singleton programs import: `from torch_memory_saver import torch_memory_saver`.
torch_memory_saver = TorchMemorySaver()

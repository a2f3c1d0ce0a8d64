"""torch_memory_saver's Python API, served by vmmshim: a program written for
torch_memory_saver (preload mode) runs unchanged when `import
torch_memory_saver` resolves here, which one line arranges:

    vmmshim run --torch-memory-saver -- python3 your_program.py

(it preloads libvmmshim.so and puts vmmshim/_tms, whose torch_memory_saver
package re-exports this module, first on PYTHONPATH).

What maps to what (docs/torch-memory-saver.md):
- region(tag, enable_cpu_backup): allocations inside carry the vmmshim tag
  "tms:TAG" ("tms:TAG:cpu-backup" with the backup), so that a pause reaches
  exactly them; vmmshim.tag gives each tag a PyTorch MemPool of its own per
  device, as torch_memory_saver does (vmmshim/_pools.py).
- pause(tag) / resume(tag): vmmshim_pause_memory of those tags, contents kept
  for the regions with enable_cpu_backup and dropped for the others; None:
  every region's tags (memory made outside regions is never paused, as in
  torch_memory_saver).
- cuda_graph(...): torch.cuda.graph with the graph's private pool tagged.
- get_cpu_backup(x): the shim's host copy of a paused tensor
  (vmmshim_get_paused_contents); None when it is not paused with a backup.
- memory_margin_bytes: vmmshim_set_memory_margin (tagged allocations that
  need new memory fail when less than the margin would stay free).
- configure_subprocess(): children preload the shim and import this module
  as torch_memory_saver.

Differences by design: memory outside regions is served by vmmshim too
(from VMM, never paused by this API); the CPU backup is the shim's pageable
host memory whatever cpu_backup_backend says; disk backup, retain_cpu_backup
and hook_mode "torch" (a pluggable allocator instead of the preload) are not
offered and say so.
"""
import contextlib
import ctypes
import os
from typing import Optional

import vmmshim

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]

_TAG_DEFAULT = "default"
_TMS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tms")
_BACKENDS = (None, "pinned", "mmap")


def shim_tag(tag: str, enable_cpu_backup: bool) -> str:
    """The vmmshim allocation tag of a region (what residency reports show)."""
    return f"tms:{tag}:cpu-backup" if enable_cpu_backup else f"tms:{tag}"


def _torch():
    # Imported late: `import torch_memory_saver` must not need CUDA yet.
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(f"torch_memory_saver (served by vmmshim) needs PyTorch: {e}") from e
    return torch


class TorchMemorySaver:
    """The torch_memory_saver singleton's class (one per process is meant)."""

    def __init__(self):
        self._regions = set()   # (tag, backup) entered so far
        self._checked = False

    # ---- regions ----
    @contextlib.contextmanager
    def region(self, tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False,
               enable_disk_backup: bool = False, cpu_backup_backend: Optional[str] = None):
        """Allocations made inside can be paused by `tag`; with
        enable_cpu_backup their contents come back at resume."""
        self._check_backup(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        self._ensure_shim()
        _torch()
        self._regions.add((tag, bool(enable_cpu_backup)))
        # vmmshim.tag gives the region a PyTorch MemPool of its own per device
        # (vmmshim/_pools.py), as torch_memory_saver does.
        with vmmshim.tag(shim_tag(tag, enable_cpu_backup)):
            yield

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global",
                   tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False,
                   cpu_backup_backend: Optional[str] = None):
        """torch.cuda.graph(...), with the memory the capture allocates (the
        graph's private pool) pausable by `tag`."""
        self._check_backup(enable_cpu_backup, False, cpu_backup_backend)
        self._ensure_shim()
        torch = _torch()
        self._regions.add((tag, bool(enable_cpu_backup)))
        with torch.cuda.graph(cuda_graph, pool=pool, stream=stream,
                              capture_error_mode=capture_error_mode):
            with vmmshim.tag(shim_tag(tag, enable_cpu_backup)):
                yield

    @contextlib.contextmanager
    def disable(self):
        """Inside a region: allocations that are not to be paused (a fresh
        MemPool, no tag), as torch_memory_saver's disable()."""
        self._ensure_shim()
        torch = _torch()
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool), vmmshim.tag(None):
            yield
        del pool

    # ---- pause and resume ----
    def pause(self, tag: Optional[str] = None):
        """Releases the physical memory of the regions of `tag` (None: all),
        keeping addresses, and contents where the region asked for a backup."""
        self._ensure_shim()
        for region_tag, backup in self._selected(tag):
            vmmshim.pause(shim_tag(region_tag, backup), keep_contents=backup)

    def resume(self, tag: Optional[str] = None):
        """Maps the paused memory of `tag` (None: all) again, contents back
        where they were kept."""
        self._ensure_shim()
        for region_tag, backup in self._selected(tag):
            vmmshim.resume(shim_tag(region_tag, backup))

    def get_cpu_backup(self, x, zero_copy: bool = False):
        """A CPU tensor with the contents of the paused tensor `x` (a region
        with enable_cpu_backup); None when `x` is not paused with a backup.
        zero_copy: a view of the shim's host copy, valid until resume."""
        torch = _torch()
        assert x.is_cuda, f"{x.device=}"
        assert x.is_contiguous(), f"{x.shape=} {x.stride()=} {x.dtype=}"
        self._ensure_shim()
        nbytes = x.nbytes
        address = vmmshim._paused_address(x.data_ptr(), nbytes)
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
        self._ensure_shim()
        lib = vmmshim._api()
        if lib is None or not hasattr(lib, "vmmshim_set_memory_margin"):
            raise RuntimeError("this libvmmshim.so has no vmmshim_set_memory_margin")
        lib.vmmshim_set_memory_margin.argtypes = [ctypes.c_size_t]
        lib.vmmshim_set_memory_margin.restype = ctypes.c_int
        rc = lib.vmmshim_set_memory_margin(value)
        if rc != 0:
            raise vmmshim.VmmshimError("vmmshim_set_memory_margin", rc)

    @property
    def retain_cpu_backup(self) -> bool:
        return False

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool):
        if value:
            raise NotImplementedError(
                "vmmshim drops its host copy at resume; retain_cpu_backup is not offered "
                "(docs/torch-memory-saver.md)")

    def set_disk_backup_dir(self, path: str):
        raise NotImplementedError(
            "vmmshim keeps paused contents in host memory; disk backup is not offered "
            "(docs/torch-memory-saver.md)")

    # ---- helpers ----
    def _selected(self, tag):
        return sorted(r for r in self._regions if tag is None or r[0] == tag)

    @staticmethod
    def _check_backup(enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
        if enable_disk_backup:
            raise NotImplementedError(
                "vmmshim keeps paused contents in host memory; enable_disk_backup is not "
                "offered (use enable_cpu_backup=True; docs/torch-memory-saver.md)")
        if cpu_backup_backend not in _BACKENDS:
            raise ValueError(f"cpu_backup_backend must be 'pinned' or 'mmap', not "
                             f"{cpu_backup_backend!r}")
        if cpu_backup_backend is not None and not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")

    def _ensure_shim(self):
        if self._checked:
            return
        if not vmmshim.loaded():
            raise RuntimeError(
                "torch_memory_saver (served by vmmshim): libvmmshim.so is not loaded in this "
                "process; start it with `vmmshim run --torch-memory-saver -- python3 ...`, or "
                "with LD_PRELOAD set to vmmshim.library_path()")
        env = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if "expandable_segments:True" in env.replace(" ", ""):
            # A MemPool's segments would be one growing mapping shared by
            # every region: a pause by tag could not tell them apart.
            raise RuntimeError(
                "torch_memory_saver regions need PYTORCH_CUDA_ALLOC_CONF without "
                "expandable_segments:True (so does torch_memory_saver itself); vmmshim's own "
                "API pauses expandable segments (vmmshim.tag, docs/pause-resume.md)")
        self._checked = True


@contextlib.contextmanager
def configure_subprocess():
    """Processes started inside preload libvmmshim.so and import this module
    as torch_memory_saver (PYTHONPATH), as torch_memory_saver's own
    configure_subprocess() preloads its library."""
    saved = os.environ.get("PYTHONPATH")
    with vmmshim.configure_subprocess():
        parts = [p for p in (saved or "").split(os.pathsep) if p and p != _TMS_PATH]
        os.environ["PYTHONPATH"] = os.pathsep.join([_TMS_PATH] + parts)
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved


# The singleton programs import: `from torch_memory_saver import torch_memory_saver`.
torch_memory_saver = TorchMemorySaver()

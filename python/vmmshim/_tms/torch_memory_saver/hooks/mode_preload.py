"""torch_memory_saver.hooks.mode_preload: configure_subprocess, as programs
import it."""
import contextlib
import os

from torch_memory_saver.utils import get_binary_path_from_package

__all__ = ["configure_subprocess", "get_binary_path_from_package"]

_TMS_PATH = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def configure_subprocess():
    """Processes started inside preload the torch_memory_saver library
    (vmmshim's libvmmshim_tms.so; libvmmshim.so, which it needs, stays in
    LD_PRELOAD as `vmmshim run` set it) before what LD_PRELOAD held, and
    import the drop-in (PYTHONPATH); both restored after."""
    lib = str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload"))
    saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", "PYTHONPATH")}
    first = [lib]
    if os.path.basename(lib) == "libvmmshim_tms.so":
        # Ours needs the shim preloaded too (its hooks, dlsym's among them,
        # must come before the C library's).
        import vmmshim
        first.append(vmmshim.library_path())
    from vmmshim import _library
    os.environ["LD_PRELOAD"] = _library.preload_with(saved["LD_PRELOAD"], first)
    paths = [p for p in (saved["PYTHONPATH"] or "").split(os.pathsep) if p and p != _TMS_PATH]
    os.environ["PYTHONPATH"] = os.pathsep.join([_TMS_PATH] + paths)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

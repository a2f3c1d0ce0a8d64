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
    rest = [p for p in (saved["LD_PRELOAD"] or "").replace(" ", ":").split(":") if p and p != lib]
    if os.path.basename(lib) == "libvmmshim_tms.so":
        # Ours needs the shim preloaded too (its hooks, dlsym's among them,
        # must come before the C library's).
        import vmmshim
        shim = vmmshim.library_path()
        if not any(os.path.realpath(p) == os.path.realpath(shim) for p in rest):
            rest.insert(0, shim)
    os.environ["LD_PRELOAD"] = ":".join([lib] + rest)
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

"""torch_memory_saver.utils: the helpers its tests and programs use."""
import contextlib
import os
import sys
from pathlib import Path

__all__ = ["change_env", "get_binary_path_from_package"]

_PRELOAD_STEM = "torch_memory_saver_hook_mode_preload"


@contextlib.contextmanager
def change_env(key: str, value: str):
    """os.environ[key] = value inside; the previous value (or its absence)
    restored after."""
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def get_binary_path_from_package(stem: str) -> Path:
    """The library `stem` names: a file laid out as torch_memory_saver's
    wheel lays it out (`{stem}.abi3.so` for ROCm, `{stem}_cu{MAJOR}.abi3.so`
    for CUDA, in the package's directory or its parent), else, for the
    preload library, vmmshim's libvmmshim_tms.so, which serves it.
    FileNotFoundError naming what was looked for otherwise."""
    package_dir = Path(__file__).resolve().parent
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            torch = None
    version = getattr(torch, "version", None)
    if getattr(version, "hip", None):
        name = f"{stem}.abi3.so"
    else:
        cuda = getattr(version, "cuda", None) or ""
        name = f"{stem}_cu{cuda.split('.')[0]}.abi3.so"
    for directory in (package_dir.parent, package_dir):
        candidate = directory / name
        if candidate.exists():
            return candidate
    if stem == _PRELOAD_STEM:
        from vmmshim import _library
        candidate = Path(_library.tms_library_path())
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"torch_memory_saver (served by vmmshim): no {name} in "
                            f"{package_dir.parent} or {package_dir}")

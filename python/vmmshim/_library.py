"""The C API of libvmmshim.so as this process holds it: found with ctypes
(as C programs find it with dlsym), its signatures, its codes and errors,
and the one warning when it is absent. A leaf module (it imports nothing of
vmmshim): the public API (vmmshim/__init__.py), the sleep commands
(_sleep.py) and the torch_memory_saver drop-in (torch_memory_saver.py) call
it, none of them another's private names.

Thread safety: any thread (one lock for the library handle)."""
import contextlib
import ctypes
import functools
import json
import os
import subprocess
import sys
import threading
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
TMS_LIBRARY = "libvmmshim_tms.so"

KEEP_CONTENTS = 1  # VMMSHIM_PAUSE_KEEP_CONTENTS
SOLE_SUBMITTER = 8  # VMMSHIM_PAUSE_SOLE_SUBMITTER
NOT_SUPPORTED = 801  # CUDA_ERROR_NOT_SUPPORTED: the shim is disabled or inactive
NOT_FOUND = 500  # CUDA_ERROR_NOT_FOUND
OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY


class VmmshimError(RuntimeError):
    """A vmmshim C API call failed; `code` is its CUresult."""

    def __init__(self, call, code):
        message = f"{call} returned CUresult {code}"
        if code in _MEANINGS:
            message += f" ({_MEANINGS[code]}; the log says more)"
        if code in _CONTEXT_LOST:
            message += (f" ({_CONTEXT_LOST[code]}): the CUDA context is lost (an earlier kernel "
                        "or copy failed, and the error is sticky); paused memory cannot be "
                        "mapped back and its kept contents are lost with the process")
        super().__init__(message)
        self.call = call
        self.code = code


# What the C API's codes mean (include/vmmshim/vmmshim.h).
_MEANINGS = {
    1: "CUDA_ERROR_INVALID_VALUE: a bad argument",
    2: "CUDA_ERROR_OUT_OF_MEMORY: host memory for the contents, at a pause; device memory, "
       "at a resume (everything stays paused; free memory and resume again)",
    304: "CUDA_ERROR_OPERATING_SYSTEM: a file could not be written",
    800: "CUDA_ERROR_NOT_PERMITTED: not on this memory (exported to another process, or "
         "packed with other allocations)",
    900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: a stream capture is in progress",
}

# Sticky errors: after one, every call of the context fails (CUDA Programming
# Guide, "Error Checking"; the driver API's CUresult list).
_CONTEXT_LOST = {700: "CUDA_ERROR_ILLEGAL_ADDRESS", 702: "CUDA_ERROR_LAUNCH_TIMEOUT",
                 710: "CUDA_ERROR_ASSERT", 714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
                 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION", 716: "CUDA_ERROR_MISALIGNED_ADDRESS",
                 717: "CUDA_ERROR_INVALID_ADDRESS_SPACE", 718: "CUDA_ERROR_INVALID_PC",
                 719: "CUDA_ERROR_LAUNCH_FAILED"}


_lock = threading.Lock()
_lib = None
_absent = None  # why the API is not usable, once known
_warned = False


def api():
    """The library handle, or None (after one warning) when the API is absent."""
    global _lib, _absent
    with _lock:
        if _lib is None and _absent is None:
            lib = ctypes.CDLL(None)
            if not hasattr(lib, "vmmshim_pause_memory"):
                _absent = ("libvmmshim.so is not loaded in this process (start it with "
                           "`vmmshim run -- python3 ...`, or LD_PRELOAD=libvmmshim.so)")
            else:
                sigs = {
                    "vmmshim_set_allocation_tag": [ctypes.c_char_p],
                    "vmmshim_pause_memory": [ctypes.c_char_p, ctypes.c_uint,
                                             ctypes.POINTER(ctypes.c_size_t)],
                    "vmmshim_resume_memory": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)],
                    "vmmshim_grant_peer_access": [ctypes.c_void_p, ctypes.c_int],
                    "vmmshim_revoke_peer_access": [ctypes.c_void_p, ctypes.c_int],
                    "vmmshim_query_peer_access": [ctypes.c_void_p, ctypes.c_int,
                                                  ctypes.POINTER(ctypes.c_int)],
                    "vmmshim_release_cached_memory": [ctypes.c_int,
                                                      ctypes.POINTER(ctypes.c_size_t)],
                    "vmmshim_get_statistics": [ctypes.c_char_p, ctypes.c_size_t,
                                               ctypes.POINTER(ctypes.c_size_t)],
                    # Newer entry points: absent from an older libvmmshim.so.
                    "vmmshim_pause_memory_except": [ctypes.POINTER(ctypes.c_char_p),
                                                    ctypes.c_size_t, ctypes.c_uint,
                                                    ctypes.POINTER(ctypes.c_size_t)],
                    "vmmshim_get_residency": [ctypes.c_char_p, ctypes.c_size_t,
                                              ctypes.POINTER(ctypes.c_size_t)],
                    "vmmshim_get_paused_contents": [ctypes.c_void_p, ctypes.c_size_t,
                                                    ctypes.POINTER(ctypes.c_void_p)],
                    "vmmshim_record_memory_history": [ctypes.c_int, ctypes.c_size_t,
                                                      ctypes.c_int],
                    "vmmshim_write_snapshot": [ctypes.c_char_p],
                }
                for name, args in sigs.items():
                    if not hasattr(lib, name):
                        continue
                    fn = getattr(lib, name)
                    fn.argtypes = args
                    fn.restype = ctypes.c_int
                _lib = lib
    if _lib is None:
        warn(_absent)
    return _lib


def warn(why):
    global _warned
    if not _warned:
        _warned = True
        # Attributed to the caller's line: the first frame outside this
        # package (and outside contextlib, for `with vmmshim.tag(...)`).
        level, frame = 1, sys._getframe(0)
        while frame is not None and (
                os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR or
                frame.f_code.co_filename == contextlib.__file__):
            level, frame = level + 1, frame.f_back
        warnings.warn(f"vmmshim: {why}; vmmshim calls do nothing", RuntimeWarning,
                      stacklevel=level)


def call(name, *args):
    """Calls C function `name`; None when the shim is absent or inactive."""
    lib = api()
    if lib is None:
        return None
    rc = getattr(lib, name)(*args)
    if rc == NOT_SUPPORTED:
        warn("the shim is loaded but not serving allocations (VMMSHIM_ENABLE=0, no CUDA "
              "driver yet, or a forked child)")
        return None
    if rc != 0:
        raise VmmshimError(name, rc)
    return rc


def handle():
    """The library handle when it is known to be loaded, else None (no
    warning, no lookup)."""
    with _lock:
        return _lib


def loaded():
    """Whether libvmmshim.so's API is in this process."""
    with _lock:
        if _lib is not None:
            return True
        if _absent is not None:
            return False
    return hasattr(ctypes.CDLL(None), "vmmshim_pause_memory")


def ptr(obj):
    """An address from an int, a torch tensor (data_ptr) or a CUDA array
    (__cuda_array_interface__, CuPy and Numba)."""
    if isinstance(obj, int):
        return obj
    if hasattr(obj, "data_ptr"):
        return int(obj.data_ptr())
    if hasattr(obj, "__cuda_array_interface__"):
        return int(obj.__cuda_array_interface__["data"][0])
    raise TypeError(f"vmmshim: not a device pointer: {type(obj).__name__}")


def mapped_library(basename, prefix=False):
    """The path of the shared library `basename` mapped into this process
    (/proc/self/maps), or None. `prefix`: any file name that starts with
    `basename` (libcudart.so.13 for "libcudart.so")."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) < 6:
                    continue
                name = os.path.basename(fields[5].strip())
                if name == basename or (prefix and name.startswith(basename)):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def loaded_library():
    """The path of the libvmmshim.so mapped into this process, or None."""
    return mapped_library("libvmmshim.so")


def paused_address(obj, nbytes):
    """The host address of vmmshim.paused_contents: where the shim keeps the
    contents of paused memory `obj` (`nbytes` from it), or None when it does
    not keep them (or is absent)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"vmmshim.paused_contents: nbytes must be an int, not {type(nbytes).__name__}")
    if not 0 <= nbytes < 1 << 63:
        raise ValueError(f"vmmshim.paused_contents: nbytes must be from 0 to 2**63-1, not {nbytes}")
    lib = api()
    if lib is None or not hasattr(lib, "vmmshim_get_paused_contents"):
        return None
    host = ctypes.c_void_p()
    rc = lib.vmmshim_get_paused_contents(ptr(obj), nbytes, ctypes.byref(host))
    if rc in (NOT_FOUND, NOT_SUPPORTED):
        return None
    if rc != 0:
        raise VmmshimError("vmmshim_get_paused_contents", rc)
    return host.value


def library_path():
    """The libvmmshim.so to preload: the one this process runs under, else the
    wheel's (vmmshim/lib/libvmmshim.so), else $VMMSHIM_LIBRARY. Raises
    FileNotFoundError naming the places it looked."""
    candidates = [loaded_library(), os.path.join(_PACKAGE_DIR, "lib", "libvmmshim.so"),
                  os.environ.get("VMMSHIM_LIBRARY")]
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    raise FileNotFoundError(
        "vmmshim: no libvmmshim.so: not loaded in this process, not in the package ("
        + candidates[1] + "), and VMMSHIM_LIBRARY is not set; install the wheel "
        "(tools/build/build-wheel.sh) or point VMMSHIM_LIBRARY at build/libvmmshim.so")


def tms_library_path():
    """libvmmshim_tms.so (torch_memory_saver's C entry points): the one this
    process runs under, else the one next to libvmmshim.so (library_path())."""
    return mapped_library(TMS_LIBRARY) or os.path.join(os.path.dirname(library_path()),
                                                        TMS_LIBRARY)


def command_path():
    """The `vmmshim` command (cli/vmmshim_cli.cc): the wheel's bin/vmmshim,
    else the one next to the loaded libvmmshim.so, or to $VMMSHIM_LIBRARY (a
    build tree), or in their ../bin (an install); None when there is none."""
    candidates = [os.path.join(_PACKAGE_DIR, "bin", "vmmshim")]
    for library in (loaded_library(), os.environ.get("VMMSHIM_LIBRARY")):
        if library:
            candidates += [os.path.join(os.path.dirname(library), "vmmshim"),
                           os.path.join(os.path.dirname(library), "..", "bin", "vmmshim")]
    for c in candidates:
        if os.access(c, os.X_OK) and os.path.isfile(c):
            return c
    return None


@functools.lru_cache(maxsize=None)
def run_options():
    """{keyword: variable} of the options of `vmmshim run`, as the command
    prints them (`vmmshim options --json`; the one table is
    cli/run_options.h), not copied here. Raises FileNotFoundError when there
    is no command (command_path()), VmmshimError when it fails."""
    command = command_path()
    if command is None:
        raise FileNotFoundError(
            "vmmshim: no vmmshim command to read the options of `vmmshim run` from: not in "
            "this package's bin/, nor next to a loaded libvmmshim.so or $VMMSHIM_LIBRARY")
    done = subprocess.run([command, "options", "--json"], capture_output=True, text=True,
                          timeout=60, check=False)
    if done.returncode != 0:
        raise VmmshimError(f"vmmshim: {command} options --json failed ({done.returncode}): "
                           + done.stderr.strip())
    return {o["keyword"]: o["variable"] for o in json.loads(done.stdout)}


def preload_with(value, first):
    """An LD_PRELOAD value (`value`: entries separated by spaces or colons,
    as ld.so reads it) with the libraries `first` in front, in that order,
    and no other entry naming one of them (the same file name or the same
    real path), joined with colons (what torch_memory_saver's own
    configure_subprocess writes, and its tests read): how
    `vmmshim.environment()` and the drop-in's configure_subprocess put the
    shim (and libvmmshim_tms.so) first. `vmmshim run` applies the same rule
    (cli/run_options.h, PreloadWith); tests/python/test_preload_rule.py
    holds the two to each other."""
    def same(a, b):
        return os.path.basename(a) == os.path.basename(b) or \
            os.path.realpath(a) == os.path.realpath(b)
    rest = [p for p in (value or "").replace(":", " ").split()
            if not any(same(p, f) for f in first)]
    return ":".join(list(first) + rest)

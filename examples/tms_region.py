"""For side-by-side runs with torch_memory_saver (tools/gpu/compare-tms.sh): when
its preload library is in LD_PRELOAD, enter its "interesting region" on this
thread, as torch_memory_saver.region() does, so that this thread's cudaMalloc
calls are served from its VMM allocations (outside a region it passes them to
cudart). Its region flag is per thread. Does nothing otherwise."""
import ctypes
import os


def enter_if_preloaded():
    for path in os.environ.get("LD_PRELOAD", "").split(":"):
        if "torch_memory_saver" in path:
            lib = ctypes.CDLL(path)
            lib.tms_set_interesting_region.argtypes = [ctypes.c_bool]
            lib.tms_set_interesting_region(True)
            return True
    return False

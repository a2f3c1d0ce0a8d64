"""The simulated driver (tests/sim, as libcuda.so.1) reached through the
shim's hooks from Python, for the tests that run under LD_PRELOAD: a
primary context made current, and device memory allocated, written and
read with the driver API."""
import ctypes
import os


def driver():
    """The process's global symbols (the shim's hooks come first) after
    cuInit, with device 0's primary context current (kept as
    `primary_context` for other threads)."""
    ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)  # the simulated driver
    cu = ctypes.CDLL(None)
    assert cu.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    cu.primary_context = ctx
    cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    cu.cuMemHostGetFlags.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p]
    return cu


class DeviceMemory:
    """unittest.TestCase mixin: `cu` (a driver()) set by the class."""

    def alloc(self, nbytes):
        p = ctypes.c_uint64()
        self.assertEqual(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)), 0)
        return p.value

    def write(self, ptr, data):
        self.assertEqual(self.cu.cuMemcpyHtoD_v2(ptr, data, len(data)), 0)

    def read(self, ptr, n):
        """The bytes, or None when the driver refuses (paused memory faults)."""
        buf = ctypes.create_string_buffer(n)
        rc = self.cu.cuMemcpyDtoH_v2(buf, ptr, n)
        return buf.raw if rc == 0 else None

    def free(self, *ptrs):
        for p in ptrs:
            self.assertEqual(self.cu.cuMemFree_v2(p), 0)


class PausedAccess:
    """What an access to paused memory meets under this process's settings
    (VMMSHIM_PAUSED_ACCESS, default host; VMMSHIM_HOST_POOL_MAKE, default
    background; docs/configuration.md), for the tests' oracles."""

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        # NCCL_CUMEM_HOST_ENABLE=0 makes fault the default (config/config.h).
        nccl_off = environ.get("NCCL_CUMEM_HOST_ENABLE", "").strip() == "0"
        access = environ.get("VMMSHIM_PAUSED_ACCESS", "fault" if nccl_off else "host")
        make = environ.get("VMMSHIM_HOST_POOL_MAKE", "background").strip().lower()
        self.faults = access.strip().lower() == "fault"
        # host memory made by the pause itself: kept contents are there at
        # once; made in the background, only where an earlier pause of the
        # same sizes had it made.
        self.kept_at_once = not self.faults and make == "pause"

    def kept(self, test, read, expected):
        """Checks `read` (DeviceMemory.read of paused kept contents) and
        returns whether the contents were addressable: never wrong bytes."""
        if self.faults:
            test.assertIsNone(read)
        elif self.kept_at_once:
            test.assertEqual(read, expected)
        else:
            test.assertIn(read, (None, expected))
        return read is not None

    def dropped(self, test, read):
        """Dropped contents: a fault, or scratch (undefined bytes, no fault)."""
        if self.faults:
            test.assertIsNone(read)
        else:
            test.assertIsNotNone(read)

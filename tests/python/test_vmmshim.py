"""The Python module (python/vmmshim) on the simulated driver.

Run twice by ctest: without the shim (EXPECT_VMMSHIM_LOADED=0: it must say so
once and do nothing) and with LD_PRELOAD=libvmmshim.so over the simulated
libcuda.so.1 (EXPECT_VMMSHIM_LOADED=1: tags, pause/resume with contents,
peer access, statistics and errors through the real C API)."""
import ctypes
import os
import unittest
import warnings

import vmmshim

EXPECT_LOADED = os.environ.get("EXPECT_VMMSHIM_LOADED") == "1"
MIB = 1 << 20


@unittest.skipIf(EXPECT_LOADED, "runs without the shim")
class WithoutTheShim(unittest.TestCase):
    def test_says_so_once_and_does_nothing(self):
        self.assertFalse(vmmshim.loaded())
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with vmmshim.tag("kv"):
                pass
            self.assertEqual(vmmshim.pause("kv"), 0)
            self.assertEqual(vmmshim.resume("kv"), 0)
            self.assertEqual(vmmshim.release_cached_memory(), 0)
            self.assertIsNone(vmmshim.statistics())
            self.assertIsNone(vmmshim.query_peer_access(0x1000, 1))
        messages = [str(w.message) for w in seen]
        self.assertEqual(len(messages), 1, messages)
        self.assertEqual(seen[0].filename, __file__)  # the caller's line, not the module's
        self.assertIn("libvmmshim.so is not loaded in this process", messages[0])
        self.assertIn("LD_PRELOAD=libvmmshim.so", messages[0])


@unittest.skipUnless(EXPECT_LOADED, "runs under LD_PRELOAD=libvmmshim.so on the simulated driver")
class WithTheShim(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)  # the simulated driver
        cls.cu = ctypes.CDLL(None)  # global lookup: the shim's hooks come first
        cu = cls.cu
        assert cu.cuInit(0) == 0
        ctx = ctypes.c_void_p()
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        assert cu.cuCtxSetCurrent(ctx) == 0
        cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]

    def alloc(self, nbytes):
        p = ctypes.c_uint64()
        self.assertEqual(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)), 0)
        return p.value

    def write(self, ptr, data):
        self.assertEqual(self.cu.cuMemcpyHtoD_v2(ptr, data, len(data)), 0)

    def read(self, ptr, n):
        buf = ctypes.create_string_buffer(n)
        rc = self.cu.cuMemcpyDtoH_v2(buf, ptr, n)
        return buf.raw if rc == 0 else None

    def test_pause_and_resume_keep_contents_and_addresses(self):
        self.assertTrue(vmmshim.loaded())
        with vmmshim.tag("kv"):
            kv = self.alloc(4 * MIB)
        other = self.alloc(4 * MIB)
        data = bytes(range(256)) * (4 * MIB // 256)
        self.write(kv, data)
        released = vmmshim.pause("kv")
        self.assertGreaterEqual(released, 4 * MIB)
        self.assertIsNone(self.read(kv, 16))          # faults while paused
        self.assertIsNotNone(self.read(other, 16))    # untagged memory stays
        stats = vmmshim.statistics()
        self.assertEqual(stats["totals"]["paused_bytes"], released)
        self.assertEqual(vmmshim.pause("kv"), 0)      # already paused
        self.assertEqual(vmmshim.resume("kv"), released)
        self.assertEqual(self.read(kv, len(data)), data)
        self.assertEqual(vmmshim.statistics()["totals"]["peak_paused_bytes"], released)
        for p in (kv, other):
            self.assertEqual(self.cu.cuMemFree_v2(p), 0)

    def test_tags_nest_per_thread(self):
        with vmmshim.tag("outer"):
            a = self.alloc(4 * MIB)
            with vmmshim.tag("inner"):
                b = self.alloc(4 * MIB)
            c = self.alloc(4 * MIB)  # "outer" again
        d = self.alloc(4 * MIB)      # untagged
        self.assertEqual(vmmshim.pause("inner", keep_contents=False), 4 * MIB)
        self.assertEqual(vmmshim.pause("outer", keep_contents=False), 8 * MIB)
        self.assertIsNotNone(self.read(d, 1))
        self.assertEqual(vmmshim.resume(), 12 * MIB)
        for p in (a, b, c, d):
            self.assertEqual(self.cu.cuMemFree_v2(p), 0)

    def test_peer_access_cache_and_errors(self):
        with vmmshim.tag("shared"):
            p = self.alloc(4 * MIB)
        self.assertFalse(vmmshim.query_peer_access(p, 1))
        vmmshim.grant_peer_access(p, 1)
        self.assertTrue(vmmshim.query_peer_access(p, 1))
        vmmshim.revoke_peer_access(p, 1)
        self.assertFalse(vmmshim.query_peer_access(p, 1))
        with self.assertRaises(vmmshim.VmmshimError) as err:
            vmmshim.grant_peer_access(0x1234, 1)  # not shim memory
        self.assertEqual(err.exception.code, 1)
        with self.assertRaises(TypeError):
            vmmshim.grant_peer_access("nope", 1)
        self.assertEqual(self.cu.cuMemFree_v2(p), 0)
        self.assertIsInstance(vmmshim.release_cached_memory(), int)


if __name__ == "__main__":
    unittest.main()

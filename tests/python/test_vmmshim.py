"""The Python module (python/vmmshim) on the simulated driver.

Run twice by ctest: without the shim (EXPECT_VMMSHIM_LOADED=0: it must say so
once and do nothing) and with LD_PRELOAD=libvmmshim.so over the simulated
libcuda.so.1 (EXPECT_VMMSHIM_LOADED=1: tags, pause/resume with contents,
peer access, statistics and errors through the real C API)."""
import ctypes
import os
import subprocess
import sys
import textwrap
import time
import unittest
import warnings

import vmmshim
from vmmshim import torch_memory_saver as tms_module
from sim_cuda import DeviceMemory, PausedAccess, driver

EXPECT_LOADED = os.environ.get("EXPECT_VMMSHIM_LOADED") == "1"
MIB = 1 << 20
PAUSED = PausedAccess()  # what an access to paused memory meets here


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
            self.assertIsNone(vmmshim.record_memory_history())
            self.assertIsNone(vmmshim.snapshot("/tmp/never-written.pickle"))
        self.assertFalse(os.path.exists("/tmp/never-written.pickle"))
        messages = [str(w.message) for w in seen]
        self.assertEqual(len(messages), 1, messages)
        self.assertEqual(seen[0].filename, __file__)  # the caller's line, not the module's
        # Bad arguments are refused alike with and without the shim, at the call.
        for call in (lambda: vmmshim.tag(3), lambda: vmmshim.pause(b"kv"),
                     lambda: vmmshim.resume(3), lambda: vmmshim.pause(except_tags=[b"a"]),
                     lambda: vmmshim.pause(except_tags=[None])):
            with self.assertRaises(TypeError):
                call()
        with self.assertRaises(ValueError) as err:
            vmmshim.tag("x" * 256)
        self.assertIn("256 bytes; at most 255", str(err.exception))
        self.assertIn("CUDA_ERROR_OUT_OF_MEMORY", str(vmmshim.VmmshimError("p", 2)))
        self.assertIn("libvmmshim.so is not loaded in this process", messages[0])
        self.assertIn("LD_PRELOAD=libvmmshim.so", messages[0])


PACKAGED_LIBRARY = os.path.join(os.path.dirname(vmmshim.__file__), "lib", "libvmmshim.so")


class Environment(unittest.TestCase):
    """library_path(), environment() and configure_subprocess(), with or
    without the shim."""

    def test_library_path_and_environment(self):
        if EXPECT_LOADED:
            expected = next(line.split()[-1] for line in open("/proc/self/maps")
                            if line.rstrip().endswith("/libvmmshim.so"))
        elif os.path.isfile(PACKAGED_LIBRARY):  # the installed wheel
            expected = PACKAGED_LIBRARY
        elif os.environ.get("VMMSHIM_LIBRARY"):
            expected = os.environ["VMMSHIM_LIBRARY"]
        else:
            with self.assertRaises(FileNotFoundError) as err:
                vmmshim.library_path()
            self.assertIn("VMMSHIM_LIBRARY", str(err.exception))
            return
        self.assertEqual(os.path.realpath(vmmshim.library_path()), os.path.realpath(expected))
        env = vmmshim.environment({"LD_PRELOAD": f"/x/other.so {expected}", "A": "1"},
                                  policy="none", stats="/tmp/s.%p.json", min_bytes=None)
        # Colons, as torch_memory_saver's configure_subprocess writes them.
        self.assertEqual(env["LD_PRELOAD"].split(":"), [vmmshim.library_path(), "/x/other.so"])
        self.assertEqual(env["VMMSHIM_PEER_POLICY"], "none")
        self.assertEqual(env["VMMSHIM_STATS_FILE"], "/tmp/s.%p.json")
        self.assertNotIn("VMMSHIM_PEER_MIN_BYTES", env)
        self.assertEqual(env["A"], "1")
        with self.assertRaises(TypeError) as err:
            vmmshim.environment(polcy="none")
        self.assertIn("'polcy'", str(err.exception))
        # The drop-in's configure_subprocess: a child preloads the shim and
        # imports torch_memory_saver from vmmshim; the parent's environment
        # comes back afterwards.
        before = dict(os.environ)
        with tms_module.configure_subprocess():
            out = subprocess.run(
                [sys.executable, "-c", "import os, torch_memory_saver; "
                 "print(torch_memory_saver.__file__); print(os.environ['LD_PRELOAD'])"],
                check=True, capture_output=True, text=True).stdout.split("\n")
        self.assertEqual(dict(os.environ), before)
        self.assertIn(os.path.join("vmmshim", "_tms", "torch_memory_saver"), out[0])
        preload = out[1].replace(" ", ":").split(":")
        self.assertEqual(os.path.basename(preload[0]), "libvmmshim_tms.so")
        self.assertIn(vmmshim.library_path(), preload)


@unittest.skipIf(EXPECT_LOADED, "runs without the shim")
class DropInWithoutTheShim(unittest.TestCase):
    def test_says_how_to_start_it(self):
        saver = tms_module.TorchMemorySaver()
        with self.assertRaises(RuntimeError) as err:
            saver.pause()
        self.assertIn("vmmshim run --torch-memory-saver", str(err.exception))
        with self.assertRaises(RuntimeError):
            with saver.region(enable_disk_backup=True):
                pass
        # torch_memory_saver's own argument checks come first, in its words.
        with self.assertRaisesRegex(ValueError, "requires enable_cpu_backup"):
            with saver.region(cpu_backup_backend="pinned"):
                pass
        with self.assertRaisesRegex(ValueError, "must be 'pinned' or 'mmap'"):
            with saver.region(enable_cpu_backup=True, cpu_backup_backend="disk"):
                pass


@unittest.skipUnless(EXPECT_LOADED, "runs under LD_PRELOAD=libvmmshim.so on the simulated driver")
class WithTheShim(DeviceMemory, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cu = driver()

    def test_snapshot_with_history_tags_and_caller(self):
        import pickle
        import tempfile
        vmmshim.record_memory_history(max_entries=1000, stacks=4)
        with vmmshim.tag("weights"):
            w = self.alloc(3 * MIB)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snap.pickle")
            self.assertEqual(vmmshim.snapshot(path), path)
            with open(path, "rb") as f:
                snap = pickle.load(f)
            with self.assertRaises(vmmshim.VmmshimError) as e:
                vmmshim.snapshot(os.path.join(d, "no-such-dir", "snap.pickle"))
            self.assertEqual(e.exception.code, 304)
        allocs = [e for t in snap["device_traces"] for e in t
                  if e["action"] == "alloc" and e["addr"] == w]
        self.assertEqual(len(allocs), 1, allocs)
        self.assertEqual(allocs[0]["category"], "weights")
        self.assertEqual(allocs[0]["size"], 3 * MIB)
        self.assertTrue(allocs[0]["frames"], allocs[0])  # a call stack was recorded
        blocks = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == w]
        self.assertEqual(blocks[0]["state"], "active_allocated")
        with self.assertRaises(vmmshim.VmmshimError):
            vmmshim.record_memory_history(stacks=65)
        vmmshim.record_memory_history(False)
        self.assertEqual(self.cu.cuMemFree_v2(w), 0)

    def test_pause_and_resume_keep_contents_and_addresses(self):
        self.assertTrue(vmmshim.loaded())
        with vmmshim.tag("kv"):
            kv = self.alloc(4 * MIB)
        other = self.alloc(4 * MIB)
        data = bytes(range(256)) * (4 * MIB // 256)
        self.write(kv, data)
        released = vmmshim.pause("kv")
        self.assertGreaterEqual(released, 4 * MIB)
        PAUSED.kept(self, self.read(kv, 16), data[:16])
        self.assertIsNotNone(self.read(other, 16))    # untagged memory stays
        stats = vmmshim.statistics()
        self.assertEqual(stats["totals"]["paused_bytes"], released)
        self.assertEqual(vmmshim.pause("kv"), 0)      # already paused
        self.assertEqual(vmmshim.resume("kv"), released)
        self.assertEqual(self.read(kv, len(data)), data)
        self.assertGreaterEqual(vmmshim.statistics()["totals"]["peak_paused_bytes"], released)
        for p in (kv, other):
            self.assertEqual(self.cu.cuMemFree_v2(p), 0)

    @unittest.skipIf(PAUSED.faults or PAUSED.kept_at_once,
                     "host memory made in the background only (the default)")
    def test_host_memory_made_in_the_background_serves_the_next_pause(self):
        size = 46 * MIB  # a size no other test pauses: nothing kept for it yet
        with vmmshim.tag("background"):
            p = self.alloc(size)
        first = bytes(range(256)) * (size // 256)
        second = bytes(reversed(range(256))) * (size // 256)
        self.write(p, first)
        vmmshim.pause("background")
        self.assertIsNone(self.read(p, 16))  # kept as fault keeps it, meanwhile
        deadline = time.monotonic() + 30
        while True:
            pools = vmmshim.residency()["host_memory_for_pauses"]
            if pools and pools[0]["queued_bytes"] == 0 and \
                    pools[0]["made_in_background_bytes"] >= size:
                break
            self.assertLess(time.monotonic(), deadline, pools)
            time.sleep(0.05)
        vmmshim.resume("background")
        self.assertEqual(self.read(p, len(first)), first)
        vmmshim.pause("background")  # the same set again: host memory is there
        self.assertEqual(self.read(p, 16), first[:16])
        self.write(p, second)  # a write while paused lands in the host copy
        vmmshim.resume("background")
        self.assertEqual(self.read(p, len(second)), second)
        self.assertEqual(self.cu.cuMemFree_v2(p), 0)

    def test_a_process_that_exits_while_host_memory_is_made_exits_cleanly(self):
        # A pause and resume, then the exit at once: the exit waits for the
        # host memory being made in the background and releases it.
        program = textwrap.dedent(f"""
            import ctypes, sys
            sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
            from sim_cuda import driver
            import vmmshim
            cu = driver()
            p = ctypes.c_uint64()
            with vmmshim.tag("exit"):
                assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(48 << 20)) == 0
            vmmshim.pause("exit")
            vmmshim.resume("exit")
            print("exiting", flush=True)
        """)
        env = dict(os.environ, VMMSHIM_LOG_LEVEL="debug")
        r = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "exiting\n")
        if PAUSED.kept_at_once:  # made by the pause: kept at exit for sure
            self.assertIn("host memory kept for pauses at exit", r.stderr)

    def test_paused_contents_while_paused_with_them(self):
        with vmmshim.tag("backup"):
            kept = self.alloc(4 * MIB)
        with vmmshim.tag("dropped"):
            dropped = self.alloc(4 * MIB)
        data = bytes(range(256)) * (4 * MIB // 256)
        self.write(kept, data)
        self.assertIsNone(vmmshim.paused_contents(kept, 16))  # live
        vmmshim.pause("backup")
        vmmshim.pause("dropped", keep_contents=False)
        self.assertEqual(vmmshim.paused_contents(kept + 256, 4 * MIB - 256), data[256:])
        view = vmmshim.paused_contents(kept + 256, 4 * MIB - 256, zero_copy=True)
        self.assertTrue(view.readonly)
        self.assertEqual(view[0], data[256])  # bytes, indexable
        self.assertEqual(view.tobytes(), data[256:])
        with self.assertRaises(TypeError):
            vmmshim.paused_contents(kept, 16.0)
        with self.assertRaises(ValueError):
            vmmshim.paused_contents(kept, 1 << 64)
        self.assertIsNone(vmmshim.paused_contents(dropped, 16))
        with self.assertRaises(vmmshim.VmmshimError) as err:
            vmmshim.paused_contents(kept, 4 * MIB + 1)  # past the allocation
        self.assertEqual(err.exception.code, 1)
        vmmshim.resume()
        self.assertIsNone(vmmshim.paused_contents(kept, 16))
        self.assertEqual(self.read(kept, len(data)), data)
        for p in (kept, dropped):
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

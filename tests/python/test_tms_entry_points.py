"""torch_memory_saver's C entry points (libvmmshim_tms.so,
interpose/torch_memory_saver/tms_entry_points.cc) and the drop-in's parts
that need no PyTorch, under LD_PRELOAD="libvmmshim.so libvmmshim_tms.so" on
the simulated driver: the region state and the tags it gives allocations,
tms_pause/tms_resume with each backup kind (dropped, pinned, mmap, disk),
retained copies, TMS_INIT_ENABLE, and the errors."""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import unittest

import vmmshim
from vmmshim import torch_memory_saver as tms_module
from sim_cuda import DeviceMemory, PausedAccess, driver

MIB = 1 << 20
PAUSED = PausedAccess()  # what an access to paused memory meets here


class EntryPoints(DeviceMemory, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cu = driver()
        cls.saver = tms_module.TorchMemorySaver()
        cls.c = cls.saver._impl._binary_wrapper.cdll

    def alloc(self, nbytes, **region):
        """Device memory, made inside the region state `region` when given."""
        if not region:
            return super().alloc(nbytes)
        with self.saver._impl._with_region_config(**region):
            return super().alloc(nbytes)

    def tags(self):
        return set(vmmshim.residency()["devices"][0]["shim"]["by_tag"])

    def tearDown(self):
        self.saver.retain_cpu_backup = False

    def test_region_state_and_the_tags_it_gives(self):
        c = self.c
        self.assertFalse(c.tms_get_interesting_region())
        self.assertEqual(c.tms_get_current_tag(), b"default")
        self.assertEqual(c.tms_get_cpu_backup_backend(), b"pinned")
        with self.saver._impl._with_region_config(tag="state", enable_cpu_backup=True,
                                                  cpu_backup_backend="mmap"):
            self.assertTrue(c.tms_get_interesting_region())
            self.assertTrue(c.tms_get_enable_cpu_backup())
            self.assertEqual(c.tms_get_current_tag(), b"state")
            self.assertEqual(c.tms_get_cpu_backup_backend(), b"mmap")
            with self.saver._impl._with_region_config(tag="inner"):
                self.assertFalse(c.tms_get_enable_cpu_backup())
                self.assertEqual(c.tms_get_current_tag(), b"inner")
            self.assertEqual(c.tms_get_current_tag(), b"state")
        self.assertFalse(c.tms_get_interesting_region())
        a = self.alloc(4 * MIB, tag="state", enable_cpu_backup=True, cpu_backup_backend="mmap")
        b = self.alloc(4 * MIB, tag="state")
        d = self.alloc(4 * MIB, tag="state", enable_disk_backup=True)
        e = self.alloc(4 * MIB, tag="state", enable_cpu_backup=True)
        outside = self.alloc(4 * MIB)
        self.assertLessEqual({"tms:state:cpu-backup:mmap", "tms:state", "tms:state:disk-backup",
                              "tms:state:cpu-backup", ""}, self.tags())
        self.free(a, b, d, e, outside)

    def test_pause_and_resume_by_tag_keep_what_each_region_asked(self):
        data = bytes(range(256)) * (4 * MIB // 256)
        kept = self.alloc(4 * MIB, tag="kv", enable_cpu_backup=True)
        mmap = self.alloc(4 * MIB, tag="kv", enable_cpu_backup=True, cpu_backup_backend="mmap")
        dropped = self.alloc(4 * MIB, tag="kv")
        other = self.alloc(4 * MIB, tag="other", enable_cpu_backup=True)
        outside = self.alloc(4 * MIB)
        for p in (kept, mmap, dropped, other, outside):
            self.write(p, data)
        self.saver.pause("kv")
        for p in (kept, mmap):
            PAUSED.kept(self, self.read(p, 16), data[:16])
        PAUSED.dropped(self, self.read(dropped, 16))
        for p in (other, outside):
            self.assertEqual(self.read(p, 16), data[:16])
        self.assertEqual(vmmshim.paused_contents(kept, 16), data[:16])
        self.assertIsNone(vmmshim.paused_contents(dropped, 16))
        self.saver.resume("kv")
        self.assertEqual(self.read(kept, len(data)), data)
        self.assertEqual(self.read(mmap, len(data)), data)
        self.assertIsNone(vmmshim.paused_contents(kept, 16))  # not retained: gone
        self.saver.pause()  # every region, never memory outside them
        PAUSED.kept(self, self.read(other, 16), data[:16])
        self.assertEqual(self.read(outside, 16), data[:16])
        self.saver.resume()
        self.assertEqual(self.read(other, len(data)), data)
        self.free(kept, mmap, dropped, other, outside)

    def test_a_retained_copy_stays_at_its_address_and_is_pinned_once(self):
        first = bytes(range(256)) * (4 * MIB // 256)
        second = bytes(reversed(range(256))) * (4 * MIB // 256)
        p = self.alloc(4 * MIB, tag="retained", enable_cpu_backup=True)
        self.write(p, first)
        self.saver.retain_cpu_backup = True
        self.assertTrue(self.saver.retain_cpu_backup)
        self.c.tms_pause(b"retained")
        address = vmmshim._library.paused_address(p, 4 * MIB)
        flags = ctypes.c_uint()
        if PAUSED.kept(self, self.read(p, 16), first[:16]):
            # host VMM memory mapped at the paused address: the same bytes
            self.assertEqual(ctypes.string_at(address, 16), first[:16])
        else:  # page-locked memory of the shim's, registered
            self.assertEqual(self.cu.cuMemHostGetFlags(ctypes.byref(flags), address), 0)
        self.c.tms_resume(b"retained")
        self.assertEqual(self.read(p, len(first)), first)
        self.assertEqual(vmmshim._library.paused_address(p, 4 * MIB), address)  # kept, same place
        self.write(p, second)
        self.c.tms_pause(b"retained")
        self.assertEqual(vmmshim._library.paused_address(p, 4 * MIB), address)
        self.assertEqual(vmmshim.paused_contents(p, len(second)), second)
        self.saver.retain_cpu_backup = False
        self.c.tms_resume(b"retained")
        self.assertEqual(self.read(p, len(second)), second)
        self.assertIsNone(vmmshim.paused_contents(p, 16))
        self.assertNotEqual(self.cu.cuMemHostGetFlags(ctypes.byref(flags), address), 0)
        self.assertEqual(self.c.vmmshim_tms_last_error(), 0)
        self.free(p)

    def test_disk_backup_is_a_file_per_allocation_while_paused(self):
        data = bytes(range(256)) * (6 * MIB // 256)
        with tempfile.TemporaryDirectory() as directory:
            self.saver.set_disk_backup_dir(directory)
            ptrs = [self.alloc(6 * MIB, tag="disk", enable_disk_backup=True) for _ in range(2)]
            for p in ptrs:
                self.write(p, data)
            sizes = set()
            for _ in range(3):
                self.saver.pause("disk")
                files = os.listdir(directory)
                self.assertEqual(len(files), 2, files)
                sizes.add(sum(os.path.getsize(os.path.join(directory, f)) for f in files))
                self.saver.resume("disk")
                self.assertEqual(os.listdir(directory), [])
                for p in ptrs:
                    self.assertEqual(self.read(p, len(data)), data)
            self.assertEqual(len(sizes), 1)
            self.assertGreaterEqual(sizes.pop(), 12 * MIB)
            self.free(*ptrs)
        with self.assertRaisesRegex(ValueError, "not a directory"):
            self.saver.set_disk_backup_dir("/nonexistent/tms-disk")

    def test_a_failed_pause_raises_and_leaves_the_memory_live(self):
        self.assertEqual(self.c.tms_set_disk_backup_dir(None), 0)  # none: disk pauses fail
        p = self.alloc(4 * MIB, tag="nodir", enable_disk_backup=True)
        self.write(p, b"x" * 16)
        with self.assertRaises(vmmshim.VmmshimError) as err:
            self.saver.pause("nodir")
        self.assertEqual(err.exception.code, 1)  # CUDA_ERROR_INVALID_VALUE
        self.assertEqual(self.read(p, 16), b"x" * 16)
        self.free(p)

    def test_memory_margin(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.assertEqual(self.cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), 0)
        self.saver.memory_margin_bytes = free.value  # nothing new fits above it
        p = ctypes.c_uint64()
        with self.saver._impl._with_region_config(tag="margin"):
            rc = self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(64 * MIB))
        self.assertEqual(rc, 2)  # CUDA_ERROR_OUT_OF_MEMORY
        untagged = self.alloc(64 * MIB)  # outside regions: not held back
        self.saver.memory_margin_bytes = 0
        tagged = self.alloc(64 * MIB, tag="margin")
        self.free(untagged, tagged)
        with self.assertRaises(ValueError):
            self.saver.memory_margin_bytes = -1

    def test_tms_init_enable_puts_every_thread_in_the_default_region(self):
        program = textwrap.dedent(f"""
            import ctypes, sys, threading
            sys.path.insert(0, {os.path.dirname(__file__)!r})
            from sim_cuda import driver
            import vmmshim
            from vmmshim import torch_memory_saver as tms
            cu = driver()
            c = tms.torch_memory_saver._impl._binary_wrapper.cdll
            assert c.tms_get_interesting_region() and c.tms_get_enable_cpu_backup()
            assert c.tms_get_cpu_backup_backend() == b"mmap"
            def alloc(out):
                assert cu.cuCtxSetCurrent(cu.primary_context) == 0
                p = ctypes.c_uint64()
                assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4 << 20)) == 0
                out.append(p.value)
            ptrs = []
            alloc(ptrs)
            t = threading.Thread(target=alloc, args=(ptrs,)); t.start(); t.join()
            with tms.torch_memory_saver._impl._with_region_config(interesting=False):
                alloc(ptrs)  # disable(): outside every region
            print(sorted(vmmshim.residency()["devices"][0]["shim"]["by_tag"].items()))
            tms.torch_memory_saver.pause()
            print(vmmshim.paused_contents(ptrs[1], 16) is not None,
                  vmmshim.paused_contents(ptrs[2], 16) is None)
            tms.torch_memory_saver.resume()
        """)
        env = dict(os.environ, TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1",
                   TMS_INIT_CPU_BACKUP_BACKEND="mmap")
        out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                             text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.strip().split("\n")
        by_tag = dict(eval(lines[0]))  # noqa: S307: our own child's repr
        self.assertEqual(by_tag["tms:default:cpu-backup:mmap"]["resident_bytes"], 8 * MIB)
        self.assertEqual(by_tag[""]["resident_bytes"], 4 * MIB)
        self.assertEqual(lines[1], "True True")


class DropInConfigureSubprocess(unittest.TestCase):
    """The drop-in's configure_subprocess writes LD_PRELOAD as
    torch_memory_saver's own does and its suite reads it (split on colons):
    the hook library first, what was there kept, all restored after. (A
    space-separated value failed that suite's test_configure_subprocess on a
    GPU host.)"""

    FAKE = "/fake/torch_memory_saver_hook_mode_preload.so"

    def configured(self, initial):
        from unittest import mock
        tms_path = os.path.join(os.path.dirname(vmmshim.__file__), "_tms")
        sys.path.insert(0, tms_path)
        try:
            from torch_memory_saver.hooks import mode_preload
        finally:
            sys.path.remove(tms_path)
        saved = os.environ.get("LD_PRELOAD")
        os.environ["LD_PRELOAD"] = initial
        try:
            with mock.patch.object(mode_preload, "get_binary_path_from_package",
                                   return_value=self.FAKE):
                with mode_preload.configure_subprocess():
                    inside = os.environ["LD_PRELOAD"]
            after = os.environ["LD_PRELOAD"]
        finally:
            if saved is None:
                os.environ.pop("LD_PRELOAD", None)
            else:
                os.environ["LD_PRELOAD"] = saved
        return inside, after

    def test_the_hook_library_first_and_the_rest_kept_colon_separated(self):
        inside, after = self.configured("/other/lib.so /more/lib.so")
        self.assertEqual(inside.split(":"), [self.FAKE, "/other/lib.so", "/more/lib.so"])
        self.assertEqual(after, "/other/lib.so /more/lib.so")


if __name__ == "__main__":
    unittest.main()

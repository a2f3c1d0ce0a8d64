"""The control socket (core/control/control_server.h) and `vmmshim ps`
(cli/process_list.h) under LD_PRELOAD=libvmmshim.so on the simulated driver:
this process lists itself with what it holds and what is paused, bad
requests get an answer naming the problem, sockets of dead processes are
removed, VMMSHIM_CONTROL=0 makes none."""
import atexit
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import vmmshim
from sim_cuda import DeviceMemory, driver

MIB = 1 << 20
CLI = os.environ["CONTROL_TEST_CLI"]
DIRECTORY = tempfile.mkdtemp(prefix="vmmshim-control-")
atexit.register(shutil.rmtree, DIRECTORY, True)
os.chmod(DIRECTORY, 0o700)
os.environ["VMMSHIM_IPC_DIR"] = DIRECTORY  # read when the shim starts, at cuInit


def ps(*args):
    out = subprocess.run([CLI, "ps", "--dir", DIRECTORY, *args], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


class ControlSocket(DeviceMemory, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cu = driver()
        cls.path = os.path.join(DIRECTORY, f"ctl-{os.getpid()}.sock")
        # The shim starts (and with it the socket) at the first driver call it hooks.
        p = ctypes.c_uint64()
        assert cls.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(MIB)) == 0
        assert cls.cu.cuMemFree_v2(p.value) == 0

    def ask(self, payload):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(self.path)
            if payload is not None:
                s.sendall(payload)
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return json.loads(data)

    def test_ps_lists_this_process_with_what_it_holds(self):
        self.assertEqual(os.stat(self.path).st_mode & 0o777, 0o600)
        with vmmshim.tag("kv"):
            kv = self.alloc(8 * MIB)
        with vmmshim.tag("weights"):
            weights = self.alloc(4 * MIB)
        vmmshim.pause("kv")
        listed = [p for p in json.loads(ps("--json")) if p["pid"] == os.getpid()]
        self.assertEqual(len(listed), 1, listed)
        me = listed[0]
        self.assertTrue(me["ok"])
        self.assertEqual(me["state"], "running")
        self.assertIn("test_control_socket.py", me["command"])
        by_tag = me["residency"]["devices"][0]["shim"]["by_tag"]
        self.assertEqual(by_tag["kv"]["paused_bytes"], 8 * MIB)
        self.assertEqual(by_tag["weights"]["resident_bytes"], 4 * MIB)
        for pool in me["residency"]["host_memory_for_pauses"]:
            self.assertEqual(pool["device"], 0)
        # Once nothing is being made in the background, the table's pinned
        # column is the pools' host memory (and the pinned pool's: none here).
        deadline = time.monotonic() + 30
        while any(p["queued_bytes"] for p in vmmshim.residency()["host_memory_for_pauses"]):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)
        pools = vmmshim.residency()["host_memory_for_pauses"]
        pinned = sum(p[k] for p in pools for k in ("kept_bytes", "in_use_bytes", "scratch_bytes"))
        table = ps()
        self.assertIn("HOST PINNED", table.splitlines()[0])
        row = next(line for line in table.splitlines() if line.startswith(str(os.getpid())))
        self.assertIn("running", row)
        self.assertIn(" kv ", row + " ")
        self.assertIn(f" {pinned / MIB:.2f} MiB " if pinned >= MIB else f" {pinned} B ", row)
        vmmshim.resume("kv")
        self.free(kv, weights)

    def test_bad_requests_are_answered_with_the_problem(self):
        self.assertEqual(self.ask(b"garbage\n"),
                         {"ok": False, "error": "the request is not a JSON object"})
        self.assertEqual(self.ask(b'{"op": 3}\n'),
                         {"ok": False, "error": 'the request has no "op" string'})
        self.assertEqual(self.ask(b'{"op": "nap"}\n')["error"],
                         'unknown op "nap" (known: status, sleep, slept, wake)')
        self.assertEqual(self.ask(b'{"op": "sleep", "drop": "kv"}\n')["error"],
                         '"drop" must be an array of tags')
        self.assertEqual(self.ask(b'{"op": "wake"}\n')["error"],
                         "the process is running, not asleep")
        self.assertEqual(self.ask(b'{"op": "slept"}\n')["error"],
                         "the process is running, not sleeping")
        start = time.monotonic()
        reply = self.ask(None)  # says nothing: the listener gives up after 2 s
        self.assertLess(time.monotonic() - start, 8)
        self.assertFalse(reply["ok"])
        self.assertTrue(self.ask(b'{"op": "status"}\n')["ok"])  # and still answers

    def test_a_fork_child_leaves_the_parents_socket(self):
        child = os.fork()
        if child == 0:
            ctypes.CDLL(None).exit(0)  # the C library's exit: its exit handlers run
        os.waitpid(child, 0)
        self.assertTrue(os.path.exists(self.path))
        self.assertTrue(self.ask(b'{"op": "status"}\n')["ok"])

    def test_sockets_of_dead_processes_are_removed(self):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        dead = child.pid
        child.send_signal(signal.SIGKILL)
        child.wait()
        stale = os.path.join(DIRECTORY, f"ctl-{dead}.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(stale)  # a socket left by a process killed before its exit handler
        ps()
        self.assertFalse(os.path.exists(stale))

    def test_no_socket_with_control_off(self):
        program = textwrap.dedent(f"""
            import ctypes, os, sys
            sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
            from sim_cuda import driver
            p = ctypes.c_uint64()
            assert driver().cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 20)) == 0
            print(os.path.exists(os.path.join({DIRECTORY!r}, f"ctl-{{os.getpid()}}.sock")))
        """)
        for control, expected in (("0", "False"), ("1", "True")):
            out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                                 env=dict(os.environ, VMMSHIM_CONTROL=control), timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.strip(), expected, control)


if __name__ == "__main__":
    unittest.main()

"""A busy process slept and paused safely (core/sleep/sleep_coordinator.h) on
the simulated driver under the preloaded shim: two threads keep launching
work on the shim's memory (a fill kernel, memsets, copies that read back
what they wrote) through the gated hooks, holding the Python GIL as a
framework's launches do, while `vmmshim sleep` / `vmmshim wake` arrive from
outside, or a third thread pauses and resumes everything; no launch fails
and every read-back is what was written. Also: a process that exits, or
forks, while its threads are held."""
import os
import queue
import random
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

CLI = os.environ["DEEP_SLEEP_TEST_CLI"]
SHIM = os.environ["DEEP_SLEEP_TEST_SHIM"]
HERE = os.path.dirname(os.path.abspath(__file__))

# Commands on stdin: "start" starts the two launching threads, "pauses N"
# pauses and resumes everything N times from a third thread, "stop" stops
# the launchers and prints "result launches L errors E", "hold-exit" pauses
# everything and calls exit(3) while the launchers wait, "hold-fork" pauses
# everything and forks a child that makes a gated call.
PROGRAM = textwrap.dedent(f"""
    import ctypes, os, random, sys, threading, time
    sys.path.insert(0, {HERE!r})
    from sim_cuda import driver
    import vmmshim
    cu = driver()
    # PyDLL: the calls keep the GIL, as PyTorch's launches do.
    gil = ctypes.PyDLL(None)
    for f in (gil.cuMemsetD8Async, ):
        f.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
    gil.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
        ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    gil.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    gil.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    N = 1 << 20
    def alloc(n):
        p = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
        return p.value
    with vmmshim.tag("kv"):
        buffers = [alloc(N), alloc(N)]
    stop = threading.Event()
    counts = {{"launches": 0, "errors": 0}}
    lock = threading.Lock()
    def launcher(i):
        gil.cuCtxSetCurrent(cu.primary_context)
        p = buffers[i]
        out = ctypes.create_string_buffer(N)
        step = 0
        while not stop.is_set():
            step += 1
            v = (step * 7 + i) % 251
            errors = 0
            if i == 0:
                dst, size, val = ctypes.c_uint64(p), ctypes.c_size_t(N), ctypes.c_ubyte(v)
                params = (ctypes.c_void_p * 3)(ctypes.addressof(dst), ctypes.addressof(size),
                                               ctypes.addressof(val))
                errors += gil.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, None, params, None) != 0
            else:
                errors += gil.cuMemsetD8Async(p, v, N, None) != 0
            errors += gil.cuMemcpyDtoH_v2(out, p, N) != 0
            errors += out.raw[0] != v or out.raw[N - 1] != v
            with lock:
                counts["launches"] += 1
                counts["errors"] += errors
    threads = []
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[0] == "start":
            threads = [threading.Thread(target=launcher, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            print("started", flush=True)
        elif command[0] == "pauses":
            rng = random.Random(7)
            def pauser():
                for _ in range(int(command[1])):
                    time.sleep(rng.uniform(0.002, 0.02))
                    vmmshim.pause()
                    time.sleep(rng.uniform(0.001, 0.01))
                    vmmshim.resume()
            t = threading.Thread(target=pauser)
            t.start()
            t.join()
            print("paused-and-resumed", flush=True)
        elif command[0] == "stop":
            stop.set()
            for t in threads:
                t.join()
            print("result launches", counts["launches"], "errors", counts["errors"], flush=True)
        elif command[0] == "hold-exit":
            vmmshim.pause()
            time.sleep(0.1)  # the launchers are held now
            print("exiting", flush=True)
            ctypes.CDLL(None).exit(0)  # exit(3): the atexit handlers, the shim's included
        elif command[0] == "hold-fork":
            vmmshim.pause()
            time.sleep(0.1)
            child = os.fork()
            if child == 0:
                # Returns: the gate is open here. Zero bytes: the paused
                # memory is host memory the simulated driver shares with
                # the child (a real child has no CUDA), which a write
                # would change under the parent's launchers.
                gil.cuMemsetD8Async(buffers[0], 1, 0, None)
                os._exit(0)
            _, status = os.waitpid(child, 0)
            print("child", os.waitstatus_to_exitcode(status), flush=True)
            vmmshim.resume()
""")


class BusySleep(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="vmmshim-busy-")
        os.chmod(self.dir, 0o700)
        self.env = dict(os.environ, SIMCUDA_CHECKPOINT="1", SIMCUDA_CHECKPOINT_DIR=self.dir,
                        VMMSHIM_IPC_DIR=self.dir)
        self.log = os.path.join(self.dir, "log")
        self.child = subprocess.Popen(
            [sys.executable, "-c", PROGRAM],
            env=dict(self.env, LD_PRELOAD=SHIM, VMMSHIM_LOG_LEVEL="info"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            stderr=open(self.log, "w"))
        self.lines = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(l.strip()) for l in self.child.stdout],
                         daemon=True).start()
        self.assertEqual(self.line(), "ready")

    def tearDown(self):
        if self.child.poll() is None:
            self.vmmshim("wake", str(self.child.pid))
            self.child.kill()
        self.child.wait(timeout=30)
        subprocess.run(["rm", "-rf", self.dir])

    def line(self, seconds=20):
        try:
            return self.lines.get(timeout=seconds)
        except queue.Empty:
            with open(self.log) as f:
                self.fail(f"no line from the program in {seconds} s; its log:\n{f.read()}")

    def send(self, command):
        self.child.stdin.write(command + "\n")
        self.child.stdin.flush()

    def vmmshim(self, *args):
        return subprocess.run([CLI, *args, "--dir", self.dir], capture_output=True, text=True,
                              env=self.env, timeout=60)

    def result(self):
        self.send("stop")
        words = self.line().split()
        self.assertEqual(words[:2], ["result", "launches"])
        return int(words[2]), int(words[4])

    def test_sleeps_from_outside_during_a_launch_storm_lose_nothing(self):
        self.send("start")
        self.assertEqual(self.line(), "started")
        rng = random.Random(11)
        for cycle in range(5):
            time.sleep(rng.uniform(0.05, 0.3))
            slept = self.vmmshim("sleep", str(self.child.pid))
            self.assertEqual(slept.returncode, 0, f"cycle {cycle}: {slept.stderr}")
            time.sleep(0.05)
            woke = self.vmmshim("wake", str(self.child.pid))
            self.assertEqual(woke.returncode, 0, f"cycle {cycle}: {woke.stderr}")
        launches, errors = self.result()
        self.assertGreater(launches, 0)
        self.assertEqual(errors, 0)
        with open(self.log) as f:
            log = f.read()
        self.assertIn("quiesced the program's GPU work", log)

    def test_pauses_of_everything_from_a_third_thread_lose_nothing(self):
        self.send("start")
        self.assertEqual(self.line(), "started")
        self.send("pauses 20")
        self.assertEqual(self.line(60), "paused-and-resumed")
        launches, errors = self.result()
        self.assertGreater(launches, 0)
        self.assertEqual(errors, 0)

    def test_a_process_that_exits_while_its_threads_are_held_exits(self):
        self.send("start")
        self.assertEqual(self.line(), "started")
        self.send("hold-exit")
        self.assertEqual(self.line(), "exiting")
        # exit(3) runs the shim's exit handlers (its report, its cache given
        # back) with memory paused and two threads held, then ends them all.
        self.assertEqual(self.child.wait(timeout=20), 0)

    def test_a_child_forked_while_the_threads_are_held_finds_the_gate_open(self):
        self.send("start")
        self.assertEqual(self.line(), "started")
        self.send("hold-fork")
        self.assertEqual(self.line(), "child 0")
        launches, errors = self.result()
        self.assertEqual(errors, 0)


if __name__ == "__main__":
    unittest.main()

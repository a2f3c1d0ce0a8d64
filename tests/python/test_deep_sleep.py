"""`vmmshim sleep PID` and `vmmshim wake PID` (cli/sleep_command.h) on the
simulated driver, whose process checkpoint (tests/sim/sim_checkpoint.cc)
works between processes and blocks a locked process's driver calls: a
process under the shim sleeps (its "kv" dropped, the rest kept), its CUDA
calls wait until the wake, its weights are intact after; a failed checkpoint
is undone; each refusal names its reason and pauses nothing."""
import json
import os
import queue
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

# The sleeping process: weights (kept) and a KV cache (dropped) under tags;
# then one command per stdin line: "call" makes a driver call, "check"
# compares the weights, "stack" prints the context's stack limit (set to 4 KiB
# at the start; a sleep lowers it for the checkpoint, the wake sets it back),
# "pause" pauses a tag of its own, "resume" resumes it.
PROGRAM = textwrap.dedent(f"""
    import ctypes, hashlib, os, sys
    def print(*words, flush=True):
        # One write(2) per line: the vmmshim command the C API runs shares
        # this stdout, and a line written in two parts could be split by its.
        os.write(1, (" ".join(str(w) for w in words) + "\\n").encode())
    sys.path.insert(0, {HERE!r})
    from sim_cuda import driver
    import vmmshim
    cu = driver()
    assert cu.cuCtxSetLimit(0, ctypes.c_size_t(4096)) == 0  # CU_LIMIT_STACK_SIZE, not the default
    def alloc(n):
        p = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
        return p.value
    data = bytes(range(256)) * (16 << 12)
    with vmmshim.tag("weights"):
        weights = alloc(len(data))
    with vmmshim.tag("kv"):
        kv = alloc(8 << 20)
    assert cu.cuMemcpyHtoD_v2(weights, data, len(data)) == 0
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "call":
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
            print("called", flush=True)
        elif command == "check":
            buf = ctypes.create_string_buffer(len(data))
            rc = cu.cuMemcpyDtoH_v2(buf, weights, len(data))
            ok = rc == 0 and buf.raw == data
            kv_ok = cu.cuMemcpyHtoD_v2(kv, data, 4096) == 0
            print("weights", "intact" if ok else "differ", "kv", "usable" if kv_ok else "faults",
                  flush=True)
        elif command == "stack":
            limit = ctypes.c_size_t()
            rc = cu.cuCtxGetLimit(ctypes.byref(limit), 0)
            print("stack", rc, limit.value, flush=True)
        elif command == "pause":
            vmmshim.pause("kv", keep_contents=False)
            print("paused", flush=True)
        elif command == "resume":
            vmmshim.resume("kv")
            print("resumed", flush=True)
        elif command == "export":
            handle = (ctypes.c_char * 64)()
            rc = cu.cuIpcGetMemHandle(handle, ctypes.c_uint64(weights))
            print("exported", rc, handle.raw.hex(), flush=True)
        elif command.startswith("import "):
            # Another process's export, opened (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS).
            class Handle(ctypes.Structure):
                _fields_ = [("reserved", ctypes.c_char * 64)]
            opened = ctypes.c_uint64()
            rc = cu.cuIpcOpenMemHandle_v2(ctypes.byref(opened),
                                          Handle.from_buffer_copy(bytes.fromhex(command.split()[1])), 1)
            print("imported", rc, flush=True)
        elif command == "close":
            print("closed", cu.cuIpcCloseMemHandle(ctypes.c_uint64(opened.value)), flush=True)
        elif command == "sleep-c":
            # The C API, the same way.
            import threading, time
            lib = ctypes.CDLL(None)
            print("c-wake while running:", lib.vmmshim_wake(), flush=True)
            print("c-slept:", lib.vmmshim_sleep((ctypes.c_char_p * 1)(b"kv"), 1), flush=True)
            def wake_later():
                time.sleep(0.5)
                print("c-woke:", lib.vmmshim_wake(), flush=True)
            t = threading.Thread(target=wake_later); t.start()
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
            print("called after the wake", flush=True)
            t.join()
        elif command == "sleep-self":
            # From the program: sleep, then a thread wakes it while this one
            # waits in a driver call.
            import threading, time
            print("slept:", vmmshim.sleep(drop=["kv"]).split(": ")[1], flush=True)
            def wake_later():
                time.sleep(0.5)
                print("woke:", vmmshim.wake().split(": ")[1], flush=True)
            t = threading.Thread(target=wake_later); t.start()
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
            print("called after the wake", flush=True)
            t.join()
""")


class DeepSleep(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="vmmshim-sleep-")
        os.chmod(self.dir, 0o700)
        self.env = dict(os.environ, SIMCUDA_CHECKPOINT="1", SIMCUDA_CHECKPOINT_DIR=self.dir,
                        VMMSHIM_IPC_DIR=self.dir)
        self.children = []
        self.child = self.spawn()

    def spawn(self, **env):
        child = subprocess.Popen([sys.executable, "-c", PROGRAM],
                                 env=dict(self.env, LD_PRELOAD=SHIM, VMMSHIM_LOG_LEVEL="info",
                                          **env),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 stderr=open(os.path.join(self.dir, f"log-{len(self.children)}"),
                                             "w"))
        child.log = os.path.join(self.dir, f"log-{len(self.children)}")
        # A reader thread: select() cannot see lines the pipe's buffer already holds.
        child.lines = queue.Queue()
        threading.Thread(target=lambda: [child.lines.put(l.strip()) for l in child.stdout],
                         daemon=True).start()
        self.children.append(child)
        self.assertEqual(self.line(10, child), "ready")
        return child

    def tearDown(self):
        for child in self.children:
            self.vmmshim("wake", str(child.pid))  # whatever state a failure left
            child.stdin.close()
            child.wait(timeout=30)
        subprocess.run(["rm", "-rf", self.dir])

    def line(self, seconds, child=None):
        """A child's next output line, or None when it says nothing in time;
        the lines of the vmmshim command the C API runs (inherited stdout)
        are skipped."""
        child = child or self.child
        while True:
            try:
                line = child.lines.get(timeout=seconds)
            except queue.Empty:
                return None
            if not line.startswith("vmmshim "):
                return line

    def send(self, command, child=None):
        child = child or self.child
        child.stdin.write(command + "\n")
        child.stdin.flush()

    def vmmshim(self, *args, **env):
        return subprocess.run([CLI, *args, "--dir", self.dir], capture_output=True, text=True,
                              env=dict(self.env, **env), timeout=60)

    def state(self, child=None):
        child = child or self.child
        out = subprocess.run([CLI, "ps", "--json", "--dir", self.dir], capture_output=True,
                             text=True, env=self.env, timeout=30)
        entry = [p for p in json.loads(out.stdout) if p["pid"] == child.pid]
        return entry[0]["state"] if entry else None

    def test_sleep_blocks_cuda_calls_and_wake_brings_everything_back(self):
        pid = str(self.child.pid)
        slept = self.vmmshim("sleep", pid, "--drop", "kv")
        self.assertEqual(slept.returncode, 0, slept.stderr)
        self.assertRegex(slept.stdout, rf"^vmmshim sleep {pid}: asleep: paused [1-9][0-9]* bytes")
        self.assertEqual(self.state(), "asleep")
        again = self.vmmshim("sleep", pid)
        self.assertEqual(again.returncode, 1)
        self.assertIn("the process is asleep already; nothing paused", again.stderr)
        self.send("call")
        self.assertIsNone(self.line(1.0))  # the driver's lock holds it
        bad = self.vmmshim("wake", pid, "--onto", "GPU-0=GPU-1")
        self.assertEqual(bad.returncode, 1)
        self.assertIn("not OLD=NEW GPU UUIDs", bad.stderr)
        self.assertEqual(self.state(), "asleep")
        gpu = "GPU-12345678-1234-1234-1234-123456789abc"
        woke = self.vmmshim("wake", pid, "--onto", f"{gpu}={gpu}")
        self.assertEqual(woke.returncode, 0, woke.stderr)
        self.assertRegex(woke.stdout, rf"^vmmshim wake {pid}: running: .* resumed [1-9]")
        self.assertEqual(self.line(10), "called")
        self.send("check")
        self.assertEqual(self.line(10), "weights intact kv usable")
        self.send("stack")
        self.assertEqual(self.line(10), "stack 0 4096")
        with open(self.child.log) as log:
            self.assertIn("stack limit of 1 context(s) lowered for the checkpoint", log.read())
        self.assertEqual(self.state(), "running")
        awake = self.vmmshim("wake", pid)
        self.assertEqual(awake.returncode, 1)
        self.assertIn("the process is running, not asleep", awake.stderr)

    def test_the_stack_limit_stays_when_asked(self):
        child = self.spawn(VMMSHIM_SLEEP_LOWERS_STACK="0")
        self.assertEqual(self.vmmshim("sleep", str(child.pid)).returncode, 0)
        self.assertEqual(self.state(child), "asleep")
        self.assertEqual(self.vmmshim("wake", str(child.pid)).returncode, 0)
        self.send("stack", child)
        self.assertEqual(self.line(10, child), "stack 0 4096")
        with open(child.log) as log:
            self.assertNotIn("lowered for the checkpoint", log.read())

    def test_the_program_sleeps_itself_and_a_thread_wakes_it(self):
        self.send("sleep-self")
        self.assertEqual(self.line(30), "slept: asleep")
        # The blocked call returns at the unlock, maybe before the waker prints.
        self.assertEqual({self.line(30), self.line(30)}, {"woke: running", "called after the wake"})
        self.send("check")
        self.assertEqual(self.line(10), "weights intact kv usable")

    def test_the_c_api_sleeps_and_wakes_the_program(self):
        self.send("sleep-c")
        self.assertEqual(self.line(30), "c-wake while running: 401")  # ILLEGAL_STATE
        self.assertEqual(self.line(30), "c-slept: 0")
        self.assertEqual({self.line(30), self.line(30)}, {"c-woke: 0", "called after the wake"})
        self.send("check")
        self.assertEqual(self.line(10), "weights intact kv usable")

    def test_a_failed_checkpoint_is_undone(self):
        pid = str(self.child.pid)
        for step in ("lock", "checkpoint"):
            failed = self.vmmshim("sleep", pid, SIMCUDA_CHECKPOINT_FAIL=step)
            self.assertEqual(failed.returncode, 1)
            self.assertIn(f"CUDA_ERROR_UNKNOWN; process {pid} resumed, running as before",
                          failed.stderr)
            self.assertEqual(self.state(), "running")
            self.send("check")
            self.assertEqual(self.line(10), "weights intact kv usable")
            self.send("stack")
            self.assertEqual(self.line(10), "stack 0 4096")

    def test_a_controller_killed_mid_sleep_leaves_a_process_the_next_wake_wakes(self):
        # `vmmshim sleep` killed after the driver's lock, then after its
        # checkpoint: the process is paused and locked (or checkpointed), not
        # yet told it is asleep; a later `vmmshim wake` restores as the
        # driver's state says and resumes it.
        pid = str(self.child.pid)
        state_file = os.path.join(self.dir, f"simcuda-checkpoint-{pid}")
        for step, driver_state in (("lock", "1"), ("checkpoint", "2")):
            controller = subprocess.Popen([CLI, "sleep", pid, "--drop", "kv", "--dir", self.dir],
                                          env=dict(self.env, SIMCUDA_CHECKPOINT_STALL=step),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if os.path.exists(state_file) and open(state_file).read().strip() == driver_state:
                    break
                time.sleep(0.01)
            controller.kill()
            controller.wait(timeout=10)
            self.assertEqual(open(state_file).read().strip(), driver_state)
            self.assertEqual(self.state(), "sleeping")
            self.send("call")
            self.assertIsNone(self.line(0.5))  # the driver's lock holds it
            woke = self.vmmshim("wake", pid)
            self.assertEqual(woke.returncode, 0, woke.stderr)
            self.assertRegex(woke.stdout, rf"^vmmshim wake {pid}: running: .* resumed [1-9]")
            self.assertFalse(os.path.exists(state_file))
            self.assertEqual(self.line(10), "called")
            self.send("check")
            self.assertEqual(self.line(10), "weights intact kv usable")
            self.send("stack")
            self.assertEqual(self.line(10), "stack 0 4096")
            self.assertEqual(self.state(), "running")

    def test_a_job_sleeps_and_wakes_as_one_step(self):
        other = self.spawn()
        pids = [str(self.child.pid), str(other.pid)]
        slept = self.vmmshim("sleep", *pids, "--drop", "kv")
        self.assertEqual(slept.returncode, 0, slept.stderr)
        self.assertEqual(len(slept.stdout.splitlines()), 2, slept.stdout)
        self.assertEqual([self.state(c) for c in self.children], ["asleep", "asleep"])
        woke = self.vmmshim("wake", *pids)
        self.assertEqual(woke.returncode, 0, woke.stderr)
        for child in self.children:
            self.send("check", child)
            self.assertEqual(self.line(10, child), "weights intact kv usable")
        # One that cannot sleep: the other is not paused either.
        refused = self.vmmshim("sleep", pids[0], str(os.getpid()))
        self.assertEqual(refused.returncode, 1)
        self.assertIn("none of the processes paused", refused.stderr)
        self.assertEqual([self.state(c) for c in self.children], ["running", "running"])
        # A checkpoint that fails for one brings both back.
        failed = self.vmmshim("sleep", *pids, SIMCUDA_CHECKPOINT_FAIL="checkpoint")
        self.assertEqual(failed.returncode, 1)
        for pid in pids:
            self.assertIn(f"process {pid} resumed, running as before", failed.stderr)
        self.assertEqual([self.state(c) for c in self.children], ["running", "running"])

    def test_refusals_pause_nothing(self):
        pid = str(self.child.pid)
        unsupported = self.vmmshim("sleep", pid, SIMCUDA_CHECKPOINT="0")
        self.assertEqual(unsupported.returncode, 1)
        self.assertIn("CUDA_ERROR_NOT_SUPPORTED; nothing paused", unsupported.stderr)
        nobody = self.vmmshim("sleep", str(os.getpid()))
        self.assertEqual(nobody.returncode, 1)
        self.assertIn("the process is not running under vmmshim", nobody.stderr)
        self.send("pause")
        self.assertEqual(self.line(10), "paused")
        own = self.vmmshim("sleep", pid)
        self.assertEqual(own.returncode, 1)
        self.assertIn("bytes paused of its own; resume them first", own.stderr)
        self.send("resume")
        self.assertEqual(self.line(10), "resumed")
        self.assertEqual(self.state(), "running")
        self.send("check")
        self.assertEqual(self.line(10), "weights intact kv usable")
        # Memory exported to another process: the checkpoint cannot take it.
        self.send("export")
        self.assertRegex(self.line(10), "^exported 0 [0-9a-f]{128}$")
        shared = self.vmmshim("sleep", pid)
        self.assertEqual(shared.returncode, 1)
        self.assertIn("exported to another process (cudaIpcGetMemHandle): the driver's "
                      "checkpoint cannot take it; nothing is paused", shared.stderr)
        self.assertEqual(self.state(), "running")
        self.send("check")
        self.assertEqual(self.line(10), "weights intact kv usable")

    def test_a_process_that_maps_another_ones_memory_is_refused(self):
        # Two processes of one job: one exports its weights, the other maps
        # them (what torch.multiprocessing does with a CUDA tensor).
        importer = self.spawn()
        self.send("export")
        exported = self.line(10).split()
        self.assertEqual(exported[:2], ["exported", "0"])
        self.send("import " + exported[2], importer)
        self.assertEqual(self.line(10, importer), "imported 0")
        pid = str(importer.pid)
        refused = self.vmmshim("sleep", pid)
        self.assertEqual(refused.returncode, 1)
        self.assertIn(f"bytes of device memory that process {self.child.pid} exported "
                      "(cudaIpcOpenMemHandle); close it (cudaIpcCloseMemHandle) before the "
                      "sleep; the driver's checkpoint cannot take memory shared between "
                      "processes; nothing is paused", refused.stderr)
        # A job's sleep: refused before either pauses (the exporter, which
        # comes first, pauses nothing either).
        job = self.vmmshim("sleep", str(self.child.pid), pid)
        self.assertEqual(job.returncode, 1)
        self.assertIn("none of the processes paused", job.stderr)
        job = self.vmmshim("sleep", pid, str(self.child.pid))
        self.assertEqual(job.returncode, 1)
        self.assertIn(f"vmmshim sleep {pid}: the pause was refused: the process maps", job.stderr)
        self.assertIn("none of the processes paused", job.stderr)
        self.assertEqual([self.state(c) for c in self.children], ["running", "running"])
        for child in self.children:
            self.send("check", child)
            self.assertEqual(self.line(10, child), "weights intact kv usable")
        # Closed, it sleeps and wakes.
        self.send("close", importer)
        self.assertEqual(self.line(10, importer), "closed 0")
        slept = self.vmmshim("sleep", pid, "--drop", "kv")
        self.assertEqual(slept.returncode, 0, slept.stderr)
        woke = self.vmmshim("wake", pid)
        self.assertEqual(woke.returncode, 0, woke.stderr)
        self.send("check", importer)
        self.assertEqual(self.line(10, importer), "weights intact kv usable")


if __name__ == "__main__":
    unittest.main()

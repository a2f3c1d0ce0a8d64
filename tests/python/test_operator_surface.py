"""The operator surface against another local user and a careless one, on the
simulated driver (docs/reliability.md, "Who may talk to a process under the
shim"): files the shim writes refuse planted links, device nodes and other
users' files; `vmmshim ps`, `sleep` and `wake` refuse a socket directory
another user made and a socket served by another process; idle clients on
the control socket delay nobody; root may sleep another user's process; bad
values are refused before anything starts, pauses or locks; the deep sleep
works on the simulated driver with no setting. Cases that act as another
user (setuid 65534) run as root only and skip otherwise, saying so."""
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

CLI = os.environ["SURFACE_TEST_CLI"]
SHIM = os.environ["SURFACE_TEST_SHIM"]
APP = os.environ["SURFACE_TEST_APP"]  # tests/e2e/lcuda_app: allocates, frees, exits
HERE = os.path.dirname(os.path.abspath(__file__))
NOBODY = 65534
ROOT = os.geteuid() == 0

# A process under the shim that holds tagged memory until its stdin closes.
PROGRAM = textwrap.dedent(f"""
    import ctypes, sys
    sys.path.insert(0, {HERE!r})
    from sim_cuda import driver
    import vmmshim
    cu = driver()
    def alloc(n):
        p = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
        return p.value
    with vmmshim.tag("weights"):
        weights = alloc(4 << 20)
    with vmmshim.tag("kv"):
        kv = alloc(4 << 20)
    print("ready", flush=True)
    for line in sys.stdin:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        print("called", flush=True)
""")


def as_nobody():
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def as_nobody_do(action):
    """Runs `action` in a forked child under uid 65534 (no exec: the test's
    python may not be readable by that user); its exit status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            as_nobody()
            code = action() or 0
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1] >> 8


def nobody_can_run_the_shim():
    """Whether uid 65534 can run a Python program under the shim here: a
    python3 it may execute, and the shim, the simulated driver and the
    tests' modules readable by it."""
    python = "/usr/bin/python3"
    paths = [SHIM, os.path.join(os.environ["LD_LIBRARY_PATH"].split(":")[0], "libcuda.so.1"),
             os.path.join(HERE, "sim_cuda.py")] + \
        [os.path.join(p, "vmmshim", "__init__.py") for p in os.environ["PYTHONPATH"].split(":")
         if os.path.exists(os.path.join(p, "vmmshim"))]
    def check():
        ok = os.access(python, os.X_OK) and all(os.access(p, os.R_OK) for p in paths)
        return 0 if ok else 1
    return as_nobody_do(check) == 0


class Surface(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="vmmshim-surface-")
        os.chmod(self.dir, 0o711)  # others may pass through (their own subdirectories)
        self.sockets = os.path.join(self.dir, "sockets")
        os.mkdir(self.sockets, 0o700)
        self.env = dict(os.environ, SIMCUDA_CHECKPOINT_DIR=self.dir)
        self.env.pop("SIMCUDA_CHECKPOINT", None)  # the default: on
        self.env.pop("LD_PRELOAD", None)
        self.children = []

    def tearDown(self):
        for child in self.children:
            if child.poll() is None:
                subprocess.run([CLI, "wake", str(child.pid), "--dir", self.sockets],
                               capture_output=True, env=self.env, timeout=30)
                child.stdin.close()
                child.wait(timeout=30)
        subprocess.run(["rm", "-rf", self.dir])

    def spawn(self, sockets=None, user=None, python=sys.executable, **env):
        env = dict(self.env, LD_PRELOAD=SHIM, VMMSHIM_IPC_DIR=sockets or self.sockets, **env)
        if sockets == "":  # the default directory
            del env["VMMSHIM_IPC_DIR"]
        child = subprocess.Popen(
            [python, "-c", PROGRAM],
            env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=user)
        self.children.append(child)
        self.assertEqual(child.stdout.readline().strip(), "ready")
        return child

    def vmmshim(self, *args, dir=None, **env):
        extra = [] if dir == "" else ["--dir", dir or self.sockets]
        if args[0] in ("run",):
            extra = []
        return subprocess.run([CLI, *args, *extra], capture_output=True, text=True,
                              env=dict(self.env, **env), timeout=60)

    def state(self, child):
        out = self.vmmshim("ps", "--json")
        entry = [p for p in json.loads(out.stdout) if p["pid"] == child.pid]
        return entry[0]["state"] if entry else None

    def run_app(self, **env):
        return subprocess.run([APP, "vmm"], capture_output=True, text=True, timeout=60,
                              env=dict(self.env, LD_PRELOAD=SHIM, VMMSHIM_LOG_LEVEL="info",
                                       VMMSHIM_CONTROL="0", **env))

    # ---- files -------------------------------------------------------------

    def test_files_refuse_planted_links_device_nodes_and_other_users_files(self):
        victim = os.path.join(self.dir, "victim")
        with open(victim, "w") as f:
            f.write("the victim's 20 byte")
        stats = os.path.join(self.dir, "stats.json")
        snapshot = os.path.join(self.dir, "snap.pickle")
        trace = os.path.join(self.dir, "trace.csv")
        log = os.path.join(self.dir, "shim.log")
        for path in (stats, snapshot, trace, log):
            os.symlink(victim, path)
        r = self.run_app(VMMSHIM_STATS_FILE=stats, VMMSHIM_SNAPSHOT_FILE=snapshot,
                         VMMSHIM_TRACE_FILE=trace, VMMSHIM_LOG_FILE=log)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(victim) as f:
            self.assertEqual(f.read(), "the victim's 20 byte")
        for name, path in (("VMMSHIM_STATS_FILE", stats), ("VMMSHIM_SNAPSHOT_FILE", snapshot),
                           ("VMMSHIM_TRACE_FILE", trace), ("VMMSHIM_LOG_FILE", log)):
            self.assertIn(f"'{path}' is a symbolic link", r.stderr, name)
            self.assertTrue(os.path.islink(path), name)
        # A device node named as the snapshot stays a device node.
        node = os.path.join(self.dir, "null")
        if ROOT:
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        else:
            node = "/dev/null"
        r = self.run_app(VMMSHIM_SNAPSHOT_FILE=node, VMMSHIM_STATS_FILE=node)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"'{node}' is a character device", r.stderr)
        self.assertTrue(stat.S_ISCHR(os.lstat(node).st_mode))
        # A regular file is replaced whole, and nothing is left beside it.
        os.remove(stats)
        r = self.run_app(VMMSHIM_STATS_FILE=stats)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(stats) as f:
            json.load(f)
        self.assertEqual(sorted(n for n in os.listdir(self.dir) if n.startswith(".")), [])

    @unittest.skipUnless(ROOT, "needs root to give a file to another user (chown)")
    def test_another_users_file_is_not_replaced(self):
        theirs = os.path.join(self.dir, "theirs.json")
        with open(theirs, "w") as f:
            f.write("theirs")
        os.chown(theirs, NOBODY, NOBODY)
        r = self.run_app(VMMSHIM_STATS_FILE=theirs)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"'{theirs}' belongs to uid {NOBODY}", r.stderr)
        with open(theirs) as f:
            self.assertEqual(f.read(), "theirs")

    # ---- sockets -----------------------------------------------------------

    @unittest.skipUnless(ROOT, "needs root to act as another user (setuid)")
    def test_a_directory_another_user_made_is_refused_by_the_cli(self):
        # The other user makes the victim's socket directory first and serves
        # a socket of its own there, answering with made-up figures.
        shared = os.path.join(self.dir, "shared")  # as /tmp: anyone may make a directory
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        planted = os.path.join(shared, "planted")
        self.assertEqual(as_nobody_do(lambda: os.mkdir(planted, 0o700)), 0)
        victim = self.spawn(sockets=planted)
        ready_r, ready_w = os.pipe()
        asked = os.path.join(shared, "asked")
        impostor = os.fork()
        if impostor == 0:  # the other user's server, answering with made-up figures
            try:
                as_nobody()
                s = socket.socket(socket.AF_UNIX)
                s.bind(os.path.join(planted, f"ctl-{victim.pid}.sock"))
                s.listen(4)
                os.write(ready_w, b"x")
                while True:
                    c, _ = s.accept()
                    c.recv(4096)
                    c.sendall(b'{"ok": true, "state": "running", "residency": null}\n')
                    open(asked, "w").close()
                    c.close()
            finally:
                os._exit(0)
        try:
            self.assertEqual(os.read(ready_r, 1), b"x")
            for args in (("ps",), ("sleep", str(victim.pid)), ("wake", str(victim.pid))):
                r = self.vmmshim(*args, dir=planted)
                self.assertEqual(r.returncode, 1, (args, r.stdout, r.stderr))
                self.assertIn(f"{planted} is owned by uid {NOBODY}, not by uid 0", r.stderr, args)
                self.assertIn("nothing", r.stderr, args)
            # Nothing reached the impostor, and the victim was not checkpointed.
            self.assertFalse(os.path.exists(asked))
            self.assertFalse(os.path.exists(os.path.join(self.dir, f"simcuda-checkpoint-{victim.pid}")))
        finally:
            os.kill(impostor, 9)
            os.waitpid(impostor, 0)
        victim.stdin.write("call\n")
        victim.stdin.flush()
        self.assertEqual(victim.stdout.readline().strip(), "called")

    def test_a_socket_served_by_another_process_is_refused(self):
        victim = self.spawn(VMMSHIM_CONTROL="0")  # no listener of its own
        path = os.path.join(self.sockets, f"ctl-{victim.pid}.sock")
        impostor = socket.socket(socket.AF_UNIX)
        impostor.bind(path)
        impostor.listen(4)
        got = []
        def serve():
            try:
                c, _ = impostor.accept()
                got.append(c.recv(4096))
                c.sendall(b'{"ok": true, "state": "running", "released_bytes": 123456789}\n')
                c.close()
            except OSError:
                pass
        threading.Thread(target=serve, daemon=True).start()
        r = self.vmmshim("sleep", str(victim.pid))
        impostor.close()
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn(f"is served by pid {os.getpid()} of uid {os.geteuid()}, not by process "
                      f"{victim.pid}", r.stderr)
        self.assertIn("an impostor; nothing sent", r.stderr)
        self.assertNotIn("asleep", r.stdout)
        self.assertEqual([g for g in got if g], [])  # connected, but sent nothing

    def test_idle_clients_on_the_control_socket_delay_nobody(self):
        victim = self.spawn()
        path = os.path.join(self.sockets, f"ctl-{victim.pid}.sock")
        idle = []
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            idle.append(s)
        start = time.monotonic()
        self.assertEqual(self.state(victim), "running")
        slept = self.vmmshim("sleep", str(victim.pid), "--drop", "kv")
        self.assertEqual(slept.returncode, 0, slept.stderr)
        self.assertEqual(self.state(victim), "asleep")
        woke = self.vmmshim("wake", str(victim.pid))
        self.assertEqual(woke.returncode, 0, woke.stderr)
        self.assertLess(time.monotonic() - start, 4.0)
        for s in idle:
            s.close()

    @unittest.skipUnless(ROOT, "needs root to run a process as another user")
    def test_root_sleeps_and_wakes_another_users_process(self):
        if not nobody_can_run_the_shim():
            self.skipTest("uid 65534 cannot run /usr/bin/python3 with the shim and the "
                          "simulated driver of this build tree (not readable by it)")
        # The other user's default directory, /tmp/vmmshim-65534 (the CLI
        # finds it from the process's owner).
        victim = self.spawn(sockets="", user=as_nobody, python="/usr/bin/python3")
        self.addCleanup(lambda: print(victim.stderr.read() if victim.poll() is not None else ""))
        pid = str(victim.pid)
        slept = self.vmmshim("sleep", pid, dir="")
        self.assertEqual(slept.returncode, 0, slept.stderr)
        self.assertRegex(slept.stdout, rf"^vmmshim sleep {pid}: asleep: paused [1-9]")
        woke = self.vmmshim("wake", pid, dir="")
        self.assertEqual(woke.returncode, 0, woke.stderr)
        victim.stdin.write("call\n")
        victim.stdin.flush()
        self.assertEqual(victim.stdout.readline().strip(), "called")

    # ---- bad input ---------------------------------------------------------

    def test_bad_process_ids_and_usage_lines(self):
        for bad in ("abc", "0", "-5", "99999999999"):
            for command in ("sleep", "wake"):
                r = self.vmmshim(command, "--", bad) if bad.startswith("-") else \
                    self.vmmshim(command, bad)
                self.assertEqual(r.returncode, 2, (command, bad, r.stderr))
                self.assertIn(f"'{bad}' is not a process id", r.stderr)
                self.assertLess(len(r.stderr), 400, r.stderr)
                self.assertIn(f"usage: vmmshim {command} PID...", r.stderr)
        r = self.vmmshim("ps", "extra")
        self.assertIn("usage: vmmshim ps [--json] [--dir DIR]", r.stderr)
        r = subprocess.run([CLI], capture_output=True, text=True)
        self.assertIn("run|report|compare|trace|ps|sleep|wake", r.stderr)
        r = subprocess.run([CLI, "sleep", str(os.getpid()), "--dir", "reldir"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("'reldir': not an absolute path", r.stderr)

    def test_sleep_refuses_a_pid_twice_an_unknown_tag_and_a_long_one(self):
        victim = self.spawn()
        pid = str(victim.pid)
        for args, message in (((pid, pid), "given twice"),
                              ((pid, "--drop", ""), "--drop '': an empty tag"),
                              ((pid, "--drop", "nosuchtag"),
                               "--drop 'nosuchtag': no memory of the process has that tag (tags "
                               "held: 'kv', 'weights')"),
                              ((pid, "--drop", "x" * 100000), "tags are at most 255 bytes")):
            r = self.vmmshim("sleep", *args)
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn(message, r.stderr)
            self.assertIn("paused", r.stderr)  # "nothing paused"
            self.assertEqual(self.state(victim), "running")
        r = self.vmmshim("sleep", "1")  # init: not this user's under the shim
        self.assertEqual(r.returncode, 1)
        # A leading zero is decimal, not octal: the same process.
        slept = self.vmmshim("sleep", "0" + pid)
        self.assertEqual(slept.returncode, 0, slept.stderr)
        self.assertIn(f"vmmshim sleep {pid}: asleep", slept.stdout)
        self.assertEqual(self.vmmshim("wake", "00" + pid).returncode, 0)

    def test_report_reads_regular_files_only(self):
        shared = os.path.join(self.dir, "job")
        os.mkdir(shared)
        os.mkfifo(os.path.join(shared, "c.json"))
        os.symlink("/dev/zero", os.path.join(shared, "d.json"))
        r = subprocess.run([CLI, "report", shared], capture_output=True, text=True, timeout=20)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is a FIFO: not read", r.stderr)
        self.assertIn("is a symbolic link: not read", r.stderr)

    def test_run_checks_its_values_before_the_program_starts(self):
        marker = os.path.join(self.dir, "started")
        for args, message in ((("--log-level", "loud"), "'loud' is not"),
                              (("--cache-limit", "abc"), "'abc' is not"),
                              (("--cache-limit", "nan%"), "'nan%' is not")):
            r = subprocess.run([CLI, "run", *args, "--", "touch", marker], capture_output=True,
                               text=True, env=self.env)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(message, r.stderr)
            self.assertFalse(os.path.exists(marker))

    def test_a_relative_socket_directory_is_not_used(self):
        work = os.path.join(self.dir, "work")
        os.mkdir(work)
        child = subprocess.Popen([sys.executable, "-c", PROGRAM], cwd=work,
                                 env=dict(self.env, LD_PRELOAD=SHIM, VMMSHIM_IPC_DIR="reldir"),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        self.children.append(child)
        self.assertEqual(child.stdout.readline().strip(), "ready")
        self.assertFalse(os.path.exists(os.path.join(work, "reldir")))
        default = f"/tmp/vmmshim-{os.geteuid()}/ctl-{child.pid}.sock"
        self.assertTrue(os.path.exists(default), default)
        child.stdin.close()
        child.wait(timeout=30)
        self.assertIn("VMMSHIM_IPC_DIR", child.stderr.read())

    # ---- the first hour ----------------------------------------------------

    def test_the_simulated_driver_sleeps_a_process_with_no_setting(self):
        self.assertNotIn("SIMCUDA_CHECKPOINT", self.env)
        victim = self.spawn()
        slept = self.vmmshim("sleep", str(victim.pid))
        self.assertEqual(slept.returncode, 0, slept.stderr)
        victim.stdin.write("call\n")
        victim.stdin.flush()
        woke = self.vmmshim("wake", str(victim.pid))
        self.assertEqual(woke.returncode, 0, woke.stderr)
        self.assertEqual(victim.stdout.readline().strip(), "called")

    def test_run_names_the_simulated_driver_when_there_is_no_libcuda(self):
        env = dict(self.env)
        env.pop("LD_LIBRARY_PATH", None)
        probe = subprocess.run([sys.executable, "-c",
                                "import ctypes; ctypes.CDLL('libcuda.so.1')"], env=env,
                               capture_output=True)
        if probe.returncode == 0:
            self.skipTest("this machine has a libcuda.so.1 of its own")
        r = subprocess.run([CLI, "run", "--", "true"], capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0)
        self.assertIn("no libcuda.so.1 here", r.stderr)
        self.assertIn("simcuda", r.stderr)


if __name__ == "__main__":
    unittest.main()

"""`vmmshim trace` (cli/memory_trace.py): memory snapshots into a Perfetto timeline.

Builds snapshots in the shim's format (core/report/memory_snapshot.h) with every
action, two processes of them, and checks the Chrome trace-event JSON the script
writes: counters, allocation slices, pause, peer and out-of-memory events; then each
error a user can meet, one line and exit status 1. With VMMSHIM_CLI naming the
`vmmshim` binary (ctest sets it), the same through `vmmshim trace`.

    python3 tests/python/test_memory_trace.py -v
"""
import collections
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.environ.get("MEMORY_TRACE_SCRIPT") or \
    os.path.join(HERE, "..", "..", "cli", "memory_trace.py")
CLI = os.environ.get("VMMSHIM_CLI")
KIB, MIB = 1 << 10, 1 << 20
T0 = 1_700_000_000_000_000  # microseconds since 1970
PAUSE = "tag 'kv'"


def ev(action, t, addr=0, size=0, tag="", library="unknown", **extra):
    """One device_traces event as the shim writes it."""
    e = {"action": action, "time_us": T0 + t, "tag": tag, "thread": 77, "addr": addr,
         "size": size, "stream": 0, "category": tag or "unknown", "library": library,
         "frames": [{"filename": library, "line": 0, "name": "(caller library)"}]}
    e.update(extra)
    return e


def snapshot_event(t):
    return {"action": "snapshot", "time_us": T0 + t, "addr": 0, "size": 0, "stream": 0,
            "category": "unknown", "frames": []}


def vev(action, t, device=-1, peer=-1, size=0, tag=""):
    """One of vmmshim's own events."""
    return {"action": action, "time_us": T0 + t, "tag": tag, "thread": 77, "device": device,
            "peer": peer, "addr": 0, "size": size}


def segment(device, address, total, blocks, tag=""):
    return {"device": device, "address": address, "total_size": total,
            "allocated_size": sum(b["size"] for b in blocks),
            "active_size": sum(b["size"] for b in blocks),
            "requested_size": sum(b["requested_size"] for b in blocks), "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": [], "tag": tag, "stream_ordered": False, "blocks": blocks}


def block(address, size, requested, library="app"):
    return {"address": address, "size": size, "requested_size": requested,
            "state": "active_allocated", "frames": [], "library": library}


def vmmshim_part(pid, events, paused=()):
    return {"format": 1, "version": "0.1.0", "pid": pid, "history": True,
            "dropped_events": 0, "libraries": ["unknown", "app", "libc10_cuda"],
            "events": events, "paused_segments": list(paused)}


S1, S2, GONE = 0x7000_0000_0000, 0x7000_0020_0000, 0x7000_1000_0000
D1 = 0x7100_0000_0000


def first_process():
    """Two devices; every memory_viz action, an allocation and a segment from before
    the first event kept, and one allocation the history never saw."""
    dev0 = [
        ev("segment_alloc", 100, S1, 2 * MIB),
        ev("alloc", 110, S1, 1000, tag="kv", library="app"),
        ev("alloc", 120, S1 + 4 * KIB, 4 * KIB, library="app"),
        ev("free_requested", 130, S1 + 4 * KIB, 4 * KIB, library="app"),
        ev("free_completed", 140, S1 + 4 * KIB, 4 * KIB, library="app"),
        ev("segment_alloc", 150, S2, 8 * MIB, tag="kv"),
        ev("alloc", 150, S2, 8 * MIB, tag="kv", library="libc10_cuda"),
        ev("segment_unmap", 200, S2, 8 * MIB, tag="kv"),
        ev("segment_map", 300, S2, 8 * MIB, tag="kv"),
        ev("oom", 310, 0, 1 << 40, library="libc10_cuda", device_free=5 * MIB),
        ev("free_completed", 320, S1 + 8 * KIB, 2 * KIB, library="app"),  # before the history
        ev("segment_free", 330, GONE, 4 * MIB),  # mapped before the history
        snapshot_event(400),
    ]
    dev1 = [
        ev("segment_alloc", 105, D1, 2 * MIB),
        ev("alloc", 106, D1, 512, library="app"),
        ev("free_requested", 107, D1, 512, library="app"),
        ev("free_completed", 108, D1, 512, library="app"),
        ev("segment_free", 109, D1, 2 * MIB),
        snapshot_event(400),
    ]
    events = [
        vev("peer_enable", 90, device=1, peer=0),
        vev("peer_grant", 91, device=1, peer=0, size=2 * MIB, tag="kv"),
        vev("peer_deny", 92, device=1, peer=0, size=4 * KIB),
        vev("peer_disable", 93, device=1, peer=0),
        vev("pause_begin", 190, tag=PAUSE),
        vev("pause_end", 240, size=8 * MIB, tag=PAUSE),
        vev("resume_begin", 280, tag=PAUSE),
        vev("resume_end", 305, size=8 * MIB, tag=PAUSE),
    ]
    segments = [
        segment(0, S1, 2 * MIB, [block(S1, 1024, 1000), block(S1 + 64 * KIB, 512, 500)]),
        segment(0, S2, 8 * MIB, [block(S2, 8 * MIB, 8 * MIB, "libc10_cuda")], tag="kv"),
    ]
    return {"segments": segments, "device_traces": [dev0, dev1],
            "vmmshim": vmmshim_part(1001, events)}


def second_process():
    """One device, started earlier than the first process; paused at the snapshot."""
    dev0 = [
        ev("segment_alloc", 50, S1, 2 * MIB, tag="kv"),
        ev("alloc", 60, S1, 3000, tag="kv", library="app"),
        ev("segment_unmap", 520, S1, 2 * MIB, tag="kv"),
        snapshot_event(600),
    ]
    events = [vev("pause_begin", 500, tag=PAUSE), vev("pause_end", 530, size=2 * MIB, tag=PAUSE)]
    paused = [segment(0, S1, 2 * MIB, [block(S1, 4096, 3000)], tag="kv")]
    return {"segments": [], "device_traces": [dev0],
            "vmmshim": vmmshim_part(2002, events, paused)}


class _Global:
    """Pickles as a call of os.system: what a hostile "snapshot" would hold."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class TraceTestBase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, obj):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)
        return path

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                              timeout=60)

    def assertFails(self, result, *messages):
        """Exit 1 with one line on stderr holding each of `messages`."""
        self.assertEqual(result.returncode, 1, result.stderr)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        for m in messages:
            self.assertIn(m, lines[0])
        self.assertEqual(result.stdout, "")


class Timeline(TraceTestBase):
    """Two processes into one trace."""

    @classmethod
    def setUpClass(cls):
        cls.tmp_class = tempfile.TemporaryDirectory()
        d = cls.tmp_class.name
        cls.first = os.path.join(d, "rank0.pickle")
        cls.second = os.path.join(d, "rank1.pickle")
        for path, snap in ((cls.first, first_process()), (cls.second, second_process())):
            with open(path, "wb") as f:
                pickle.dump(snap, f, protocol=2)
        cls.result = subprocess.run([sys.executable, SCRIPT, cls.first, cls.second],
                                    capture_output=True, text=True, timeout=60)
        cls.out = os.path.join(d, "rank0.trace.json")
        cls.listing = sorted(os.listdir(d))
        with open(cls.out) as f:
            cls.trace = json.load(f)
        cls.events = cls.trace["traceEvents"]

    @classmethod
    def tearDownClass(cls):
        cls.tmp_class.cleanup()

    def of(self, pid, ph=None, name=None):
        return [e for e in self.events if e.get("pid") == pid and
                (ph is None or e["ph"] == ph) and (name is None or e.get("name") == name)]

    def counter(self, pid, name):
        """(ts, value) of a counter, in time order."""
        return [(e["ts"], next(iter(e["args"].values()))) for e in self.of(pid, "C", name)]

    def test_writes_next_to_the_first_snapshot_and_says_how_to_open_it(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        self.assertEqual(self.result.stderr, "")
        self.assertEqual(self.result.stdout.strip().splitlines(),
                         [f"wrote {self.out}: open it in https://ui.perfetto.dev "
                          "(Open trace file) or chrome://tracing"])
        # The temporary file was renamed, not left behind.
        self.assertEqual(self.listing, ["rank0.pickle", "rank0.trace.json", "rank1.pickle"])
        self.assertEqual(self.trace["displayTimeUnit"], "ms")

    def test_one_process_per_snapshot(self):
        names = {e["pid"]: e["args"]["name"] for e in self.events
                 if e["ph"] == "M" and e["name"] == "process_name"}
        self.assertEqual(names, {1001: "vmmshim pid 1001", 2002: "vmmshim pid 2002"})

    def test_time_is_relative_to_the_earliest_event_of_all_inputs(self):
        self.assertEqual(min(e["ts"] for e in self.events if "ts" in e), 0)
        self.assertEqual(self.trace["otherData"]["time_origin_us"], T0 + 50)
        oom = self.of(1001, "i")
        oom = [e for e in oom if e["cat"] == "oom"][0]
        self.assertEqual(oom["ts"], 310 - 50)

    def test_counters_start_from_what_was_there_and_end_at_the_snapshot(self):
        live = self.counter(1001, "cuda:0 live")
        # From the process's first event (a peer event at 90): the allocation freed at
        # 320 and the one the snapshot lists that the history never saw.
        self.assertEqual(live[0], (90 - 50, 2 * KIB + 500))
        self.assertEqual(dict(live)[120 - 50], 2 * KIB + 500 + 1000 + 4 * KIB)
        self.assertEqual(dict(live)[140 - 50], 2 * KIB + 500 + 1000)
        self.assertEqual(live[-1], (400 - 50, 1000 + 500 + 8 * MIB))
        mapped = self.counter(1001, "cuda:0 segments")
        self.assertEqual(mapped[:2], [(90 - 50, 4 * MIB), (100 - 50, 4 * MIB + 2 * MIB)])
        values = dict(mapped)
        self.assertEqual(values[200 - 50], 4 * MIB + 2 * MIB)            # paused
        self.assertEqual(values[300 - 50], 4 * MIB + 2 * MIB + 8 * MIB)  # resumed
        self.assertEqual(mapped[-1], (400 - 50, 2 * MIB + 8 * MIB))
        self.assertEqual(self.counter(1001, "cuda:1 live")[-1], (400 - 50, 0))
        self.assertEqual(max(v for _, v in self.counter(1001, "cuda:1 live")), 512)
        self.assertEqual(self.counter(1001, "cuda:1 segments")[-1], (400 - 50, 0))
        self.assertEqual(self.counter(2002, "cuda:0 live")[-1], (600 - 50, 3000))
        self.assertEqual(self.counter(2002, "cuda:0 segments")[-1], (600 - 50, 0))
        for pid in (1001, 2002):
            for e in self.of(pid, "C"):
                self.assertGreaterEqual(next(iter(e["args"].values())), 0, e)

    def test_every_allocation_slice_is_closed(self):
        begins, ends = {}, {}
        for e in self.events:
            if e["ph"] in "be":
                key = (e["pid"], e["id2"]["local"])
                (begins if e["ph"] == "b" else ends).setdefault(key, []).append(e)
        self.assertEqual(set(begins), set(ends))
        for key, (b,) in begins.items():
            (e,) = ends[key]
            self.assertEqual((b["name"], b["cat"]), (e["name"], e["cat"]))
            self.assertLessEqual(b["ts"], e["ts"])
        by_name = collections.defaultdict(list)
        for key, (b,) in begins.items():
            by_name[(key[0], b["name"])].append((b, ends[key][0]))
        (b, e), = by_name[(1001, "8.0 MiB libc10_cuda on cuda:0")]
        self.assertEqual(b["cat"], "kv")
        self.assertEqual(b["args"]["address"], hex(S2))
        self.assertEqual(b["args"]["bytes"], 8 * MIB)
        self.assertEqual(b["args"]["library"], "libc10_cuda")
        self.assertEqual(b["args"]["frame"], "libc10_cuda:0:(caller library)")
        self.assertEqual((e["ts"], e["args"]), (400 - 50, {"live": True}))
        (b, e), = by_name[(1001, "4.0 KiB app on cuda:0")]
        self.assertEqual((b["cat"], b["ts"], e["ts"]), ("untagged", 120 - 50, 140 - 50))
        self.assertEqual(e["args"], {"free_requested_us": 130 - 50})
        (b, e), = by_name[(1001, "2.0 KiB app on cuda:0")]
        self.assertTrue(b["args"]["before_history"])
        self.assertEqual((b["ts"], e["ts"]), (90 - 50, 320 - 50))
        (b, e), = by_name[(1001, "500 B app on cuda:0")]
        self.assertTrue(b["args"]["before_history"])
        self.assertTrue(e["args"]["live"])
        self.assertEqual(len(by_name[(2002, "2.9 KiB app on cuda:0")]), 1)

    def test_pause_and_resume_slices(self):
        slices = {e["name"]: e for e in self.of(1001, "X")}
        self.assertEqual(set(slices), {f"pause {PAUSE}", f"paused {PAUSE}", f"resume {PAUSE}"})
        pause = slices[f"pause {PAUSE}"]
        self.assertEqual((pause["ts"], pause["dur"]), (190 - 50, 50))
        self.assertEqual(pause["args"]["bytes"], 8 * MIB)
        self.assertEqual(pause["args"]["selection"], PAUSE)
        paused = slices[f"paused {PAUSE}"]
        self.assertEqual((paused["ts"], paused["dur"]), (240 - 50, 40))
        self.assertEqual(slices[f"resume {PAUSE}"]["dur"], 25)
        track = {e["tid"]: e["args"]["name"] for e in self.of(1001, "M", "thread_name")}
        self.assertEqual(track[pause["tid"]], "pause and resume")
        # Still paused at the snapshot: the paused slice runs to its end.
        still = {e["name"]: e for e in self.of(2002, "X")}[f"paused {PAUSE}"]
        self.assertEqual((still["ts"] + still["dur"], still["args"]["still_paused"]),
                         (600 - 50, True))

    def test_peer_access_instants(self):
        peers = [e for e in self.of(1001, "i") if e["cat"] == "peer"]
        self.assertEqual([e["name"] for e in peers],
                         ["enable cuda:0 → cuda:1", "grant cuda:0 → cuda:1 2.0 MiB",
                          "deny cuda:0 → cuda:1 4.0 KiB", "disable cuda:0 → cuda:1"])
        grant = peers[1]
        self.assertEqual(grant["args"]["bytes"], 2 * MIB)
        self.assertEqual(grant["args"]["tag"], "kv")
        self.assertEqual((grant["args"]["accessing device"], grant["args"]["owner device"]),
                         (0, 1))
        self.assertEqual(grant["s"], "t")
        track = {e["tid"]: e["args"]["name"] for e in self.of(1001, "M", "thread_name")}
        self.assertEqual(track[grant["tid"]], "peer access")

    def test_out_of_memory_instant(self):
        (oom,) = [e for e in self.of(1001, "i") if e["cat"] == "oom"]
        self.assertEqual(oom["s"], "p")
        self.assertEqual(oom["name"], "out of memory on cuda:0: 1.0 TiB requested")
        args = oom["args"]
        self.assertEqual((args["requested"], args["device_free"], args["tag"], args["library"]),
                         (1 << 40, 5 * MIB, "", "libc10_cuda"))
        self.assertEqual(args["live requested bytes"], 2 * KIB + 500 + 1000 + 8 * MIB)
        self.assertEqual(args["mapped bytes"], 4 * MIB + 2 * MIB + 8 * MIB)


class Inputs(TraceTestBase):
    """Inputs other than one snapshot per process."""

    def test_a_pytorch_snapshot_is_read_from_its_device_traces(self):
        snap = first_process()
        del snap["vmmshim"]
        path = self.write("torch.pickle", snap)
        out = os.path.join(self.dir, "t.json")
        result = self.run_script(path, "-o", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(out) as f:
            events = json.load(f)["traceEvents"]
        names = [e["args"]["name"] for e in events if e.get("name") == "process_name"]
        self.assertEqual(names, ["PyTorch snapshot torch.pickle"])
        self.assertFalse([e for e in events if e.get("cat") == "peer"])
        self.assertTrue([e for e in events if e.get("cat") == "oom"])

    def test_two_snapshots_of_one_process_stay_apart(self):
        a = self.write("snap.pickle", first_process())
        b = self.write("snap.oom.pickle", first_process())
        out = os.path.join(self.dir, "t.json")
        self.assertEqual(self.run_script(a, b, "-o", out).returncode, 0)
        with open(out) as f:
            events = json.load(f)["traceEvents"]
        names = sorted(e["args"]["name"] for e in events if e.get("name") == "process_name")
        self.assertEqual(names, ["vmmshim pid 1001", "vmmshim pid 1001 (snap.oom.pickle)"])
        self.assertEqual(len({e["pid"] for e in events}), 2)

    def test_a_snapshot_without_history(self):
        snap = first_process()
        snap["device_traces"] = []
        snap["vmmshim"]["events"] = []
        snap["vmmshim"]["history"] = False
        path = self.write("quiet.pickle", snap)
        result = self.run_script(path)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(self.dir, "quiet.trace.json")) as f:
            events = json.load(f)["traceEvents"]
        live = [e for e in events if e.get("name") == "cuda:0 live"]
        self.assertEqual(live[-1]["args"]["requested bytes"], 1000 + 500 + 8 * MIB)


class Errors(TraceTestBase):
    """Each exits 1 with one line naming the file and the problem."""

    def test_missing_file(self):
        path = os.path.join(self.dir, "nope.pickle")
        self.assertFails(self.run_script(path), path, "cannot read it: No such file")

    def test_not_a_pickle(self):
        path = os.path.join(self.dir, "text.pickle")
        with open(path, "w") as f:
            f.write("hello, world\n")
        self.assertFails(self.run_script(path), path, "not a pickle")

    def test_truncated(self):
        path = self.write("cut.pickle", first_process())
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
        self.assertFails(self.run_script(path), path, "a truncated pickle")

    def test_a_statistics_file_is_said_to_be_json(self):
        path = os.path.join(self.dir, "stats.json")
        with open(path, "w") as f:
            f.write('{"format": 1}\n')
        self.assertFails(self.run_script(path), path, "not a pickle (it looks like JSON")

    def test_empty_file(self):
        path = os.path.join(self.dir, "empty.pickle")
        open(path, "w").close()
        self.assertFails(self.run_script(path), path, "not a pickle (the file is empty)")

    def test_a_pickle_that_imports_code_is_refused_without_running_it(self):
        marker = os.path.join(self.dir, "ran")
        path = self.write("evil.pickle", _Global(f"touch {marker}"))
        self.assertFails(self.run_script(path), path, "refused", "system",
                         "nothing in it was run")
        self.assertFalse(os.path.exists(marker))

    def test_a_pickle_that_is_not_a_snapshot(self):
        path = self.write("other.pickle", {"weights": [1.0, 2.0]})
        self.assertFails(self.run_script(path), path, "not a vmmshim memory snapshot")
        path = self.write("list.pickle", [1, 2, 3])
        self.assertFails(self.run_script(path), path, "not a vmmshim memory snapshot")

    def test_another_format(self):
        snap = first_process()
        snap["vmmshim"]["format"] = 2
        path = self.write("new.pickle", snap)
        self.assertFails(self.run_script(path), path,
                         "written by another vmmshim version (format 2); "
                         "this one reads format 1")

    def test_malformed_events(self):
        snap = first_process()
        del snap["device_traces"][0][3]["time_us"]
        path = self.write("bad.pickle", snap)
        self.assertFails(self.run_script(path), path, "device_traces[0][3] has no time_us")

    def test_unwritable_output(self):
        path = self.write("snap.pickle", first_process())
        out = os.path.join(self.dir, "no-such-dir", "t.json")
        self.assertFails(self.run_script(path, "-o", out), f"cannot write {out}",
                         "No such file or directory")

    def test_output_over_a_snapshot_is_refused(self):
        path = self.write("snap.pickle", first_process())
        self.assertFails(self.run_script(path, "-o", path), "is one of the snapshots")
        with open(path, "rb") as f:
            self.assertEqual(pickle.load(f)["vmmshim"]["pid"], 1001)

    def test_a_bad_second_file_writes_nothing(self):
        good = self.write("good.pickle", first_process())
        bad = os.path.join(self.dir, "missing.pickle")
        self.assertFails(self.run_script(good, bad), bad)
        self.assertEqual(sorted(os.listdir(self.dir)), ["good.pickle"])


@unittest.skipUnless(CLI, "VMMSHIM_CLI (the vmmshim binary) is not set")
class ThroughTheCli(TraceTestBase):
    """`vmmshim trace` runs the script next to it with the arguments passed through."""

    def run_cli(self, *args):
        return subprocess.run([CLI, "trace", *args], capture_output=True, text=True, timeout=60)

    def test_converts(self):
        path = self.write("snap.pickle", first_process())
        out = os.path.join(self.dir, "out.json")
        result = self.run_cli(path, "-o", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"wrote {out}", result.stdout)
        with open(out) as f:
            self.assertTrue(json.load(f)["traceEvents"])

    def test_errors_name_the_command(self):
        path = os.path.join(self.dir, "nope.pickle")
        self.assertFails(self.run_cli(path), f"vmmshim trace: {path}: cannot read it")
        path = self.write("other.pickle", {"a": 1})
        self.assertFails(self.run_cli(path), "vmmshim trace:", "not a vmmshim memory snapshot")

    def test_needs_a_snapshot(self):
        result = self.run_cli()
        self.assertEqual(result.returncode, 2)
        self.assertIn("usage: vmmshim trace", result.stderr)


if __name__ == "__main__":
    unittest.main()

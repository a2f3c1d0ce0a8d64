#!/usr/bin/env python3
"""Turns vmmshim memory snapshots into one timeline for Perfetto or chrome://tracing.

    memory_trace.py [-o OUT] SNAPSHOT...      (vmmshim trace SNAPSHOT... [-o OUT])

SNAPSHOT: a pickle the shim wrote (VMMSHIM_SNAPSHOT_FILE, core/report/memory_snapshot.h);
several (one per process, such as the ranks of torchrun) share one time axis. OUT, a Chrome
trace-event JSON file, defaults to the first snapshot's path with ".trace.json" for its
extension. A PyTorch snapshot without vmmshim's part (torch.cuda.memory._dump_snapshot) is
converted from its device_traces alone.

Per snapshot, one process (docs/memory-snapshots.md, "Timeline in Perfetto"):
  - per device, two counters: the requested bytes of live allocations, and the bytes of
    mapped segments (physical memory the shim holds);
  - each allocation as an async slice from alloc to free_completed ("8.0 MiB libc10_cuda
    on cuda:0", category = its tag); ones still live close at the snapshot with live=true;
  - pause, paused and resume as slices on a "pause and resume" track;
  - peer enable, disable, grant and deny as instants on a "peer access" track;
  - each out-of-memory failure as an instant of the process.

Errors (a file that cannot be read, is not a pickle, is not a memory snapshot, was written
by another format, or an OUT that cannot be written) exit 1 with one line on standard
error. Pickles are read without importing anything they name, so a hostile file cannot run
code: a snapshot holds only dicts, lists, strings and numbers.
"""
import argparse
import datetime
import io
import json
import os
import pickle
import sys
import tempfile

# The layout of the snapshot's "vmmshim" part this reader knows (kSnapshotFormat).
SNAPSHOT_FORMAT = 1

# Trace tids of the tracks this script makes up; real thread ids stay below 2**22
# (pid_max), and each process gets its own block so that no two processes share one.
_TRACK_TID_BASE = 1 << 30
_TRACK_TIDS_PER_PROCESS = 4096
_PEER_TRACK = 0
_ALLOCATION_TRACK = 1       # + device (catapult draws async slices under a thread)
_PAUSE_TRACK = 2048         # + lane, for pauses that overlap
# Trace pids for snapshots whose pid is unknown or already taken (above pid_max).
_SYNTHETIC_PID_BASE = 1 << 22

_PEER_ACTIONS = ("peer_enable", "peer_disable", "peer_grant", "peer_deny")
_PAUSE_ACTIONS = ("pause_begin", "pause_end", "resume_begin", "resume_end")


class ConversionError(Exception):
    """A snapshot or output that cannot be handled; str() is the one-line reason."""


class _RefusedGlobal(Exception):
    """A pickle that names a Python object to import (module.name)."""


class _DataOnlyUnpickler(pickle.Unpickler):
    """Loads plain data only: every import a pickle asks for is refused."""

    def find_class(self, module, name):
        raise _RefusedGlobal(f"{module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it uses persistent ids")


def human_bytes(n):
    """A byte count as "1000 B", "4.0 KiB", "8.0 MiB"."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    return f"{n} B"  # not reached


def _first_frame(frames):
    """The innermost frame as memory_viz prints it ("file:line:name"), or None."""
    if not isinstance(frames, list) or not frames or not isinstance(frames[0], dict):
        return None
    f = frames[0]
    return f"{f.get('filename', '?')}:{f.get('line', 0)}:{f.get('name', '?')}"


def load_snapshot(path):
    """The snapshot at `path` as a dict; ConversionError saying why it is not one."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConversionError(f"cannot read it: {e.strerror or e}") from None
    if not data:
        raise ConversionError("not a pickle (the file is empty)")
    try:
        snapshot = _DataOnlyUnpickler(io.BytesIO(data)).load()
    except _RefusedGlobal as e:
        raise ConversionError(
            f"refused: the pickle imports {e} (code, which a memory snapshot never holds); "
            "nothing in it was run") from None
    except Exception as e:  # any malformed stream: UnpicklingError, EOFError, ValueError...
        if data.lstrip()[:1] in (b"{", b"["):
            raise ConversionError("not a pickle (it looks like JSON: vmmshim trace reads "
                                  "memory snapshots, .pickle)") from None
        if data[:1] == b"\x80" and (isinstance(e, EOFError) or "truncated" in str(e)):
            raise ConversionError("a truncated pickle (the snapshot was cut short)") from None
        raise ConversionError("not a pickle") from None
    if not isinstance(snapshot, dict):
        raise ConversionError(
            f"not a vmmshim memory snapshot (a pickled {type(snapshot).__name__}, not a dict)")
    vmm = snapshot.get("vmmshim")
    if vmm is None:
        if isinstance(snapshot.get("device_traces"), list) and \
                isinstance(snapshot.get("segments"), list):
            return snapshot  # PyTorch's own snapshot
        raise ConversionError("not a vmmshim memory snapshot (no 'vmmshim' part)")
    if not isinstance(vmm, dict):
        raise ConversionError("not a vmmshim memory snapshot ('vmmshim' is not a dict)")
    fmt = vmm.get("format")
    if fmt != SNAPSHOT_FORMAT:
        which = "no format number" if fmt is None else f"format {fmt}"
        raise ConversionError(f"written by another vmmshim version ({which}); "
                              f"this one reads format {SNAPSHOT_FORMAT}")
    return snapshot


def _list(value, where):
    """`value` if it is a list ([] for None); ConversionError naming `where` otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConversionError(f"malformed snapshot: {where} is not a list")
    return value


def _events(snapshot):
    """(device traces, vmmshim events), checked for the fields the timeline needs."""
    traces = _list(snapshot.get("device_traces"), "device_traces")
    vmm = snapshot.get("vmmshim") or {}
    extra = _list(vmm.get("events"), "vmmshim.events")
    checked = [(f"device_traces[{d}]", _list(t, f"device_traces[{d}]"))
               for d, t in enumerate(traces)]
    checked.append(("vmmshim.events", extra))
    for where, events in checked:
        for i, e in enumerate(events):
            if not isinstance(e, dict) or not isinstance(e.get("action"), str):
                raise ConversionError(
                    f"malformed snapshot: {where}[{i}] is not an event (a dict with an action)")
            t = e.get("time_us")
            if not isinstance(t, (int, float)) or isinstance(t, bool):
                raise ConversionError(f"malformed snapshot: {where}[{i}] has no time_us")
            for key in ("addr", "size"):
                v = e.get(key, 0)
                if not isinstance(v, int) or isinstance(v, bool):
                    raise ConversionError(
                        f"malformed snapshot: {where}[{i}].{key} is not a whole number")
    return [t for _, t in checked[:-1]], extra


class _Process:
    """The trace events of one snapshot, as one process of the timeline."""

    def __init__(self, path, snapshot, events, trace_pid, index, t0):
        self.path = path
        self.snapshot = snapshot
        self.pid = trace_pid
        self.index = index
        self.t0 = t0
        self.vmm = snapshot.get("vmmshim")
        self.traces, self.extra = events
        self.out = []
        self.next_id = 0
        self.tid_base = _TRACK_TID_BASE + index * _TRACK_TIDS_PER_PROCESS
        times = [e["time_us"] for t in self.traces for e in t]
        times += [e["time_us"] for e in self.extra]
        self.first = min(times) if times else t0
        self.last = max(times) if times else t0
        # A history that recorded and then stopped says nothing of what came after.
        self.stopped = bool(times) and bool(self.vmm) and not self.vmm.get("history", True)

    def ts(self, time_us):
        return time_us - self.t0

    def emit(self, event):
        event["pid"] = self.pid
        self.out.append(event)

    def track(self, offset, name, sort_index):
        tid = self.tid_base + offset
        self.out.append({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid,
                         "args": {"name": name}})
        self.out.append({"ph": "M", "name": "thread_sort_index", "pid": self.pid, "tid": tid,
                         "args": {"sort_index": sort_index}})
        return tid

    # ---- allocations and segments of one device ----

    def device(self, device, trace, live_blocks, mapped_segments):
        """Counters and allocation slices of `device` from its events; `live_blocks`
        and `mapped_segments` (address -> bytes, from the snapshot's segments, or None)
        say what was there at the end, so what the history did not see is still drawn."""
        tid = self.track(_ALLOCATION_TRACK + device, f"cuda:{device} allocations", 10 + device)
        requested, mapped = [], []  # (time_us, delta), in event order
        req_before = map_before = 0   # bytes there before the first event
        live = {}                     # address -> allocation
        segments = {}                 # address -> [bytes, mapped]
        ooms = []

        def begin(e, time_us, size, before_history=False):
            self.next_id += 1
            tag = e.get("tag") or ""
            library = e.get("library") or "unknown"
            a = {"id": f"0x{self.next_id:x}", "cat": tag or "untagged",
                 "name": f"{human_bytes(size)} {library} on cuda:{device}", "size": size}
            args = {"address": f"0x{e.get('addr', 0):x}", "bytes": size, "tag": tag,
                    "library": library, "stream": e.get("stream", 0),
                    "thread": e.get("thread"), "device": device}
            frame = _first_frame(e.get("frames"))
            if frame:
                args["frame"] = frame
            if before_history:
                args["before_history"] = True
            self.emit({"ph": "b", "cat": a["cat"], "name": a["name"], "id2": {"local": a["id"]},
                       "tid": tid, "ts": self.ts(time_us), "args": args})
            return a

        def end(a, time_us, **args):
            self.emit({"ph": "e", "cat": a["cat"], "name": a["name"], "id2": {"local": a["id"]},
                       "tid": tid, "ts": self.ts(time_us), "args": args})

        for e in trace:
            action, t, addr, size = e["action"], e["time_us"], e.get("addr", 0), e.get("size", 0)
            if action == "alloc":
                old = live.pop(addr, None)
                if old is not None:  # its free fell out of the history
                    end(old, t, free_not_recorded=True)
                    requested.append((t, -old["size"]))
                live[addr] = begin(e, t, size)
                requested.append((t, size))
            elif action == "free_requested":
                if addr in live:
                    live[addr]["free_requested"] = t
            elif action == "free_completed":
                a = live.pop(addr, None)
                if a is None:  # allocated before the first event kept
                    a = begin(e, self.first, size, before_history=True)
                    req_before += size
                args = {}
                if "free_requested" in a and a["free_requested"] != t:
                    args["free_requested_us"] = self.ts(a["free_requested"])
                end(a, t, **args)
                requested.append((t, -a["size"]))
            elif action == "segment_alloc":
                old = segments.get(addr)
                if old is not None and old[1]:
                    mapped.append((t, -old[0]))
                segments[addr] = [size, True]
                mapped.append((t, size))
            elif action == "segment_free":
                s = segments.pop(addr, None)
                if s is None:
                    map_before += size
                    mapped.append((t, -size))
                elif s[1]:
                    mapped.append((t, -s[0]))
            elif action == "segment_unmap":
                s = segments.get(addr)
                if s is None:
                    map_before += size
                    segments[addr] = [size, False]
                    mapped.append((t, -size))
                elif s[1]:
                    s[1] = False
                    mapped.append((t, -size))
            elif action == "segment_map":
                s = segments.get(addr)
                if s is None:
                    segments[addr] = [size, True]
                    mapped.append((t, size))
                elif not s[1]:
                    s[1] = True
                    mapped.append((t, size))
            elif action == "oom":
                ooms.append((e, len(requested), len(mapped)))

        # What the snapshot holds that the history never saw was there all along.
        if live_blocks is not None:
            for addr, block in sorted(live_blocks.items()):
                if addr not in live:
                    live[addr] = begin(block, self.first, block["size"], before_history=True)
                    req_before += block["size"]
        if mapped_segments is not None:
            for addr, size in sorted(mapped_segments.items()):
                if addr not in segments:
                    map_before += size
        for a in live.values():
            end(a, self.last, live="unknown: the history had stopped" if self.stopped else True)

        req_values = self.counter(f"cuda:{device} live", "requested bytes", req_before, requested)
        map_values = self.counter(f"cuda:{device} segments", "mapped bytes", map_before, mapped)
        for e, n_req, n_map in ooms:
            args = {"device": device, "requested": e.get("size", 0),
                    "device_free": e.get("device_free"), "tag": e.get("tag") or "",
                    "library": e.get("library") or "unknown", "stream": e.get("stream", 0),
                    "thread": e.get("thread"),
                    "live requested bytes": req_values[n_req],
                    "mapped bytes": map_values[n_map]}
            frame = _first_frame(e.get("frames"))
            if frame:
                args["frame"] = frame
            self.emit({"ph": "i", "s": "p", "cat": "oom", "ts": self.ts(e["time_us"]),
                       "name": f"out of memory on cuda:{device}: "
                               f"{human_bytes(e.get('size', 0))} requested",
                       "args": args})

    def counter(self, name, key, before, deltas):
        """Emits the counter; gives its value after each of `deltas` (index 0: before)."""
        values = [before]
        points = [(self.first, before)]
        for t, d in deltas:
            values.append(values[-1] + d)
            if points[-1][0] == t:
                points[-1] = (t, values[-1])  # one value per microsecond: the last
            else:
                points.append((t, values[-1]))
        if points[-1][0] != self.last:
            points.append((self.last, values[-1]))
        for t, v in points:
            self.emit({"ph": "C", "name": name, "ts": self.ts(t), "args": {key: v}})
        return values

    # ---- vmmshim's own events ----

    def peer_events(self):
        events = [e for e in self.extra if e.get("action") in _PEER_ACTIONS]
        if not events:
            return
        tid = self.track(_PEER_TRACK, "peer access", 1)
        for e in events:
            action = e["action"][len("peer_"):]
            owner, peer = e.get("device", -1), e.get("peer", -1)
            args = {"accessing device": peer, "owner device": owner, "thread": e.get("thread")}
            name = f"{action} cuda:{peer} → cuda:{owner}"
            if action in ("grant", "deny"):
                size = e.get("size", 0)
                name += f" {human_bytes(size)}"
                args.update({"bytes": size, "tag": e.get("tag") or ""})
                if e.get("addr"):
                    args["address"] = f"0x{e['addr']:x}"
            self.emit({"ph": "i", "s": "t", "cat": "peer", "name": name, "tid": tid,
                       "ts": self.ts(e["time_us"]), "args": args})

    def pause_events(self):
        events = [e for e in self.extra if e.get("action") in _PAUSE_ACTIONS]
        if not events:
            return
        slices = []    # (start, end, name, args)
        open_ops = {}  # (kind, thread, selection) -> begin event
        paused = {}    # selection -> pause_end event not yet resumed
        for e in events:
            kind, phase = e["action"].split("_")
            selection = e.get("tag") or ""
            key = (kind, e.get("thread"), selection)
            if phase == "begin":
                open_ops[key] = e
                if kind == "resume" and selection in paused:
                    p = paused.pop(selection)
                    slices.append((p["time_us"], e["time_us"], f"paused {selection}",
                                   {"selection": selection, "bytes": p.get("size", 0)}))
                continue
            b = open_ops.pop(key, None)
            args = {"selection": selection, "bytes": e.get("size", 0), "thread": e.get("thread")}
            if b is None:
                args["begin_not_recorded"] = True
            slices.append((b["time_us"] if b else e["time_us"], e["time_us"],
                           f"{kind} {selection}", args))
            if kind == "pause" and e.get("size", 0) > 0:  # a failed pause paused nothing
                paused[selection] = e
        for (kind, thread, selection), b in open_ops.items():
            slices.append((b["time_us"], self.last, f"{kind} {selection}",
                           {"selection": selection, "thread": thread, "unfinished": True}))
        if self.vmm and self.vmm.get("paused_segments"):
            for selection, p in paused.items():
                slices.append((p["time_us"], self.last, f"paused {selection}",
                               {"selection": selection, "bytes": p.get("size", 0),
                                "still_paused": True}))
        # Overlapping slices (pauses from several threads) go on lanes of their own.
        lane_ends = []
        for start, stop, name, args in sorted(slices, key=lambda s: (s[0], s[1])):
            lane = next((i for i, t in enumerate(lane_ends) if t <= start), None)
            if lane is None:
                lane = len(lane_ends)
                lane_ends.append(stop)
                self.track(_PAUSE_TRACK + lane, "pause and resume", 0)
            lane_ends[lane] = stop
            self.emit({"ph": "X", "cat": "pause", "name": name,
                       "tid": self.tid_base + _PAUSE_TRACK + lane, "ts": self.ts(start),
                       "dur": stop - start, "args": args})

    # ---- the whole process ----

    def convert(self, label):
        self.out.append({"ph": "M", "name": "process_name", "pid": self.pid,
                         "args": {"name": label}})
        self.out.append({"ph": "M", "name": "process_sort_index", "pid": self.pid,
                         "args": {"sort_index": self.index}})
        self.out.append({"ph": "M", "name": "process_labels", "pid": self.pid,
                         "args": {"labels": os.path.basename(self.path)}})
        dropped = self.vmm.get("dropped_events", 0) if self.vmm else 0
        if dropped:
            self.emit({"ph": "i", "s": "p", "cat": "history", "ts": self.ts(self.first),
                       "name": f"history: {dropped} older events dropped",
                       "args": {"dropped_events": dropped}})
        self.pause_events()
        self.peer_events()
        live_blocks, mapped_segments = self.final_state()
        devices = set(range(len(self.traces))) | set(live_blocks or ()) | \
            set(mapped_segments or ())
        for d in sorted(devices):
            trace = self.traces[d] if d < len(self.traces) else []
            if not trace and not (live_blocks or {}).get(d) and not (mapped_segments or {}).get(d):
                continue
            self.device(d, trace,
                        None if live_blocks is None else live_blocks.get(d, {}),
                        None if mapped_segments is None else mapped_segments.get(d, {}))
        return self.out

    def final_state(self):
        """Per device, the live allocations (address -> block) and mapped segments
        (address -> bytes) the snapshot lists; None, None where they cannot be trusted
        against the history: a PyTorch snapshot (its events carry block sizes), or a
        history that had stopped recording."""
        if not self.vmm or self.stopped:
            return None, None
        live, mapped = {}, {}
        lists = [("segments", _list(self.snapshot.get("segments"), "segments"), True),
                 ("vmmshim.paused_segments",
                  _list(self.vmm.get("paused_segments"), "vmmshim.paused_segments"), False)]
        for where, segments, holds_memory in lists:
            for i, s in enumerate(segments):
                if not isinstance(s, dict) or not isinstance(s.get("device"), int) or \
                        s["device"] < 0:
                    raise ConversionError(f"malformed snapshot: {where}[{i}] has no device")
                d = s["device"]
                if holds_memory:
                    mapped.setdefault(d, {})[s.get("address", 0)] = s.get("total_size", 0)
                for b in _list(s.get("blocks"), f"{where}[{i}].blocks"):
                    if isinstance(b, dict) and b.get("state") == "active_allocated":
                        live.setdefault(d, {})[b.get("address", 0)] = {
                            "addr": b.get("address", 0), "size": b.get("requested_size", 0),
                            "tag": s.get("tag") or "", "library": b.get("library"),
                            "frames": b.get("frames"), "stream": s.get("stream", 0)}
        return live, mapped


def convert(paths):
    """The trace (a dict for json) of the snapshots at `paths`; ConversionError names
    the file at fault."""
    loaded = []
    t0 = None
    for path in paths:
        try:
            snapshot = load_snapshot(path)
            traces, extra = _events(snapshot)
        except ConversionError as e:
            raise ConversionError(f"{path}: {e}") from None
        loaded.append((path, snapshot, (traces, extra)))
        for t in traces + [extra]:
            for e in t:
                if t0 is None or e["time_us"] < t0:
                    t0 = e["time_us"]
    t0 = t0 or 0

    events, used_pids, sources = [], set(), []
    for index in range(len(loaded)):
        path, snapshot, checked = loaded[index]
        loaded[index] = None  # converted, its memory can go (large histories, many ranks)
        vmm = snapshot.get("vmmshim")
        pid = vmm.get("pid") if vmm else None
        if vmm:
            label = f"vmmshim pid {pid}"
        else:
            label = f"PyTorch snapshot {os.path.basename(path)}"
        trace_pid = pid
        if not isinstance(pid, int) or pid <= 0 or pid in used_pids:
            trace_pid = _SYNTHETIC_PID_BASE + index
            if vmm:
                label += f" ({os.path.basename(path)})"  # two snapshots of one process
        used_pids.add(trace_pid)
        try:
            events += _Process(path, snapshot, checked, trace_pid, index, t0).convert(label)
        except ConversionError as e:
            raise ConversionError(f"{path}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # A field of an unexpected type the checks above let through.
            raise ConversionError(f"{path}: malformed snapshot ({type(e).__name__}: {e})") \
                from None
        sources.append({"path": path, "pid": pid, "trace_pid": trace_pid,
                        "format": "vmmshim" if vmm else "pytorch"})
    # Metadata first, then by time; the sort is stable, so a slice that begins and
    # ends in one microsecond keeps its order.
    events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0)))
    try:
        origin = datetime.datetime.fromtimestamp(t0 / 1e6, tz=datetime.timezone.utc).isoformat()
    except (OverflowError, ValueError, OSError):  # a clock far off
        origin = None
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "vmmshim trace", "time_origin_us": t0,
                          "time_origin_utc": origin, "snapshots": sources}}


def write_atomically(path, trace):
    """Writes `trace` to `path` through a temporary file renamed over it, so that a
    reader never sees half a trace; ConversionError on failure."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # One event a line: readable and greppable, and still one JSON document;
            # written in chunks, as a whole string would double the memory a large
            # history takes.
            encode = json.JSONEncoder(separators=(",", ":")).encode
            events = trace["traceEvents"]
            f.write('{"traceEvents": [\n')
            for start in range(0, len(events), 10000):
                if start:
                    f.write(",\n")
                f.write(",\n".join(encode(e) for e in events[start:start + 10000]))
            f.write("\n],\n")
            rest = {k: v for k, v in trace.items() if k != "traceEvents"}
            f.write(json.dumps(rest, indent=1)[1:].lstrip("\n"))
            f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it 0600; the output is no secret
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise ConversionError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def default_output(snapshot_path):
    """The first snapshot's path with ".trace.json" for its extension."""
    root, _ = os.path.splitext(snapshot_path)
    return root + ".trace.json"


def main(argv=None):
    # `vmmshim trace` names itself so that its errors say which command spoke.
    prog = os.environ.get("VMMSHIM_TRACE_COMMAND") or os.path.basename(sys.argv[0])
    parser = argparse.ArgumentParser(
        prog=prog, description="Turn vmmshim memory snapshots (one per process) into one "
        "Perfetto / chrome://tracing timeline (Chrome trace-event JSON).")
    parser.add_argument("snapshots", nargs="+", metavar="SNAPSHOT",
                        help="memory snapshot pickles (VMMSHIM_SNAPSHOT_FILE); a PyTorch "
                        "snapshot without vmmshim's part is converted from its device_traces")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="the JSON file to write (default: the first SNAPSHOT with "
                        ".trace.json for its extension)")
    args = parser.parse_args(argv)
    out = args.output if args.output else default_output(args.snapshots[0])
    if any(os.path.realpath(out) == os.path.realpath(p) for p in args.snapshots):
        print(f"{prog}: {out} is one of the snapshots; name another output (-o OUT)",
              file=sys.stderr)
        return 1
    try:
        trace = convert(args.snapshots)
        write_atomically(out, trace)
    except ConversionError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}: open it in https://ui.perfetto.dev (Open trace file) "
          "or chrome://tracing")
    return 0


if __name__ == "__main__":
    sys.exit(main())

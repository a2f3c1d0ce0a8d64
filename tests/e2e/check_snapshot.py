#!/usr/bin/env python3
"""Checks the memory snapshots history_app.c makes the shim write (tests/e2e/memory_history.sh).

usage: check_snapshot.py APP_STDOUT APP_STDERR EXIT_SNAPSHOT PAUSED_SNAPSHOT OOM_SNAPSHOT

Every event kind is present with its fields; segments are tiled by their blocks as PyTorch's
_memory_viz.segsum asserts; allocations name the library that made them (the program, and a
library calling through a stand-in shared libcudart); the paused snapshot lists the paused
blocks apart; the out-of-memory report names the holders. Prints one line per failed check.
"""
import pickle
import sys

MEMORY_VIZ_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc",
                      "segment_free", "segment_map", "segment_unmap", "oom", "snapshot"}
OWN_ACTIONS = {"peer_enable", "peer_disable", "peer_grant", "peer_deny", "pause_begin",
               "pause_end", "resume_begin", "resume_end"}

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def check_segments(name, segments):
    for seg in segments:
        at = seg["address"]
        total = 0
        for b in seg["blocks"]:
            check(b["address"] == at, f"{name}: block at {b['address']:#x} does not follow {at:#x}")
            check(b["requested_size"] <= b["size"], f"{name}: block {b['address']:#x} requested > size")
            check(b["state"] in ("active_allocated", "inactive"), f"{name}: state {b['state']}")
            for f in b["frames"]:
                check({"filename", "line", "name"} <= f.keys(), f"{name}: frame fields {f}")
            at += b["size"]
            total += b["size"]
        check(total == seg["total_size"], f"{name}: blocks of {seg['address']:#x} do not tile it")
        active = sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        check(seg["allocated_size"] == active, f"{name}: allocated_size of {seg['address']:#x}")
        for key in ("device", "stream", "segment_type", "is_expandable", "frames", "requested_size"):
            check(key in seg, f"{name}: segment lacks {key}")


def block_library(snapshot, address):
    for seg in snapshot["segments"] + snapshot["vmmshim"]["paused_segments"]:
        for b in seg["blocks"]:
            if b["address"] == address and b["state"] == "active_allocated":
                return b.get("library")
    return None


def main():
    out_path, err_path, exit_path, paused_path, oom_path = sys.argv[1:6]
    out = open(out_path).read()
    err = open(err_path).read()
    addresses = {}
    for line in out.splitlines():
        if line.startswith("address "):
            _, name, value = line.split()
            addresses[name] = int(value, 16)
    check(out.rstrip().endswith("OK"), "history_app did not print OK")

    snapshots = {"exit": load(exit_path), "paused": load(paused_path), "oom": load(oom_path)}
    for name, s in snapshots.items():
        check(s["vmmshim"]["format"] == 1, f"{name}: format {s['vmmshim']['format']}")
        check(len(s["device_traces"]) == 2, f"{name}: {len(s['device_traces'])} device traces")
        check_segments(name, s["segments"])
        check_segments(name + " paused", s["vmmshim"]["paused_segments"])
        for trace in s["device_traces"]:
            check(trace and trace[-1]["action"] == "snapshot", f"{name}: trace does not end in snapshot")
            for e in trace:
                check(e["action"] in MEMORY_VIZ_ACTIONS, f"{name}: action {e['action']}")
                check({"addr", "size", "stream", "time_us", "frames", "category"} <= e.keys(),
                      f"{name}: event fields {sorted(e)}")

    exit_snapshot = snapshots["exit"]
    seen = {e["action"] for t in exit_snapshot["device_traces"] for e in t}
    check(seen == MEMORY_VIZ_ACTIONS, f"exit: memory_viz actions missing: {MEMORY_VIZ_ACTIONS - seen}")
    own = {e["action"] for e in exit_snapshot["vmmshim"]["events"]}
    check(own == OWN_ACTIONS, f"exit: vmmshim events missing: {OWN_ACTIONS - own}")
    events = [e for t in exit_snapshot["device_traces"] for e in t]

    def first(action, **fields):
        for e in events + exit_snapshot["vmmshim"]["events"]:
            if e["action"] == action and all(e.get(k) == v for k, v in fields.items()):
                return e
        return None

    # Caller libraries: the program itself, a library calling the driver directly, and one
    # calling through the stand-in shared libcudart (found by the stack scan).
    paused = snapshots["paused"]
    for name, library in (("small", "history_app"), ("large", "history_app"),
                          ("direct", "libhistory_caller"), ("scanned", "libhistory_caller"),
                          ("kv_large", "history_app")):
        check(block_library(paused, addresses[name]) == library,
              f"paused: {name} from {block_library(paused, addresses[name])}, expected {library}")
        alloc = first("alloc", addr=addresses[name])
        check(alloc is not None and alloc["library"] == library, f"exit: alloc of {name}: {alloc}")
    again = first("alloc", addr=addresses["scanned_again"])
    check(again is not None and again["library"] == "libhistory_caller",
          f"exit: the second allocation through the stand-in libcudart: {again}")
    scanned = first("alloc", addr=addresses["scanned"])
    names = [f["name"] for f in (scanned or {}).get("frames", [])]
    check("caller_allocate" in names, f"exit: call stack of the scanned allocation: {names}")
    # Tags become categories; the paused tag's blocks are listed apart while paused.
    kv = first("alloc", addr=addresses["kv_large"])
    check(kv is not None and kv["category"] == "kv" and kv["tag"] == "kv", f"exit: kv alloc {kv}")
    paused_addresses = {b["address"] for s in paused["vmmshim"]["paused_segments"] for b in s["blocks"]}
    live_addresses = {b["address"] for s in paused["segments"] for b in s["blocks"]}
    check(addresses["kv_large"] in paused_addresses and addresses["kv_large"] not in live_addresses,
          "paused: kv_large not listed as paused")
    check(first("segment_unmap", addr=addresses["kv_large"]) is not None, "exit: no segment_unmap of kv")
    check(first("segment_map", addr=addresses["kv_large"]) is not None, "exit: no segment_map of kv")
    # Stream-ordered allocation on a stream.
    check(any(e["action"] == "alloc" and e["stream"] != 0 for e in events), "exit: no alloc on a stream")
    # The stream-ordered allocation, live at the paused snapshot: its block names its library.
    so = [b.get("library") for seg in paused["segments"] if seg["stream_ordered"]
          for b in seg["blocks"] if b["state"] == "active_allocated"]
    check(so == ["history_app"], f"paused: stream-ordered blocks' libraries {so}")
    # Peer decisions under min-size 1M: the 4 KiB allocation denied, the 2 MiB one granted.
    check(first("peer_deny", device=1, peer=0, size=4096) is not None, "exit: no peer_deny")
    check(first("peer_grant", device=1, peer=0, size=2 << 20) is not None, "exit: no peer_grant")
    check(first("peer_enable", device=1, peer=0) is not None, "exit: no peer_enable")
    pause_end = first("pause_end")
    check(pause_end is not None and pause_end["size"] == 8 << 20, f"exit: pause_end {pause_end}")
    # The failed allocation: an oom event, the report in the log, the .oom snapshot.
    oom = first("oom")
    check(oom is not None and oom["size"] == 1 << 40 and oom["device_free"] > 0, f"exit: oom {oom}")
    check(first("oom") is not None and snapshots["oom"] is not None, "oom snapshot")
    for text in ("out of memory: cuMemAlloc of 1.0 TiB on device 0 (untagged, from history_app)",
                 "largest live allocations:", "by library: history_app", "libhistory_caller",
                 "memory snapshot written to ",
                 "memory snapshot not written to '/nonexistent-dir/x.pickle'"):
        check(text in err, f"log lacks {text!r}")
    # Times are microseconds since 1970 and never go back within a device.
    for t in exit_snapshot["device_traces"]:
        times = [e["time_us"] for e in t]
        check(times == sorted(times), "exit: times go back")
        check(all(x > 1.6e15 for x in times), "exit: time_us is not since 1970")

    for f in failures:
        print("FAILED:", f)
    print("OK" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

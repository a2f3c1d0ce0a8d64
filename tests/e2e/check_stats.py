"""Runs a program with VMMSHIM_STATS_FILE and checks the JSON report.
usage: check_stats.py PROGRAM [ARGS...]   (LD_PRELOAD etc. in the environment)"""
import json
import os
import subprocess
import sys
import tempfile

with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, VMMSHIM_STATS_FILE=os.path.join(tmp, "stats.%p.json"))
    subprocess.run(sys.argv[1:], env=env, check=True)
    files = os.listdir(tmp)
    assert len(files) == 1 and files[0].startswith("stats.") and files[0] != "stats.%p.json", files
    with open(os.path.join(tmp, files[0])) as f:
        doc = json.load(f)
print(json.dumps(doc, indent=1)[:1500])
assert doc["totals"]["served_allocations"] > 0, doc["totals"]
dev1 = [d for d in doc["devices"] if d["device"] == 1][0]
assert dev1["allocations"] == 5 and dev1["peak_physical_bytes"] > 0, dev1
peer0 = [p for p in dev1["peers"] if p["peer"] == 0][0]
assert peer0["grants"] >= 1, peer0
calls = {c["entry"]: c for c in doc["driver_calls"]}
assert calls["cuMemCreate"]["calls"] >= 4 and calls["cuMemSetAccess"]["calls"] >= 5, calls
assert all(c["seconds"] >= 0 for c in calls.values())
# peer_app calls cuCtxEnablePeerAccess four times (two refused, one accepted,
# one already enabled): each counted, with its time.
t = doc["totals"]
assert t["peer_enable_calls"] == 4 and 0 < t["peer_enable_seconds"] < 10, t
print("stats file OK")

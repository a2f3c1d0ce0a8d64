"""Draws the overhead curves of a tools/multi-gpu-run.sh log (docs/multi-gpu.md).
usage: python3 tools/plot_multi_gpu.py LOG PNG   (needs matplotlib)"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

log = open(sys.argv[1]).read()
enable = {}
for policy, n, us in re.findall(
        r"-- (\S+): enable: (\d+) live allocations on the peer: cudaDeviceEnablePeerAccess median ([\d.]+) us", log):
    enable.setdefault(policy, []).append((int(n), float(us) / 1000))
latency = {}
section = None
for line in log.splitlines():
    m = re.match(r"-- (\S+)$", line)
    if m:
        section = m.group(1)
    m = re.match(r"latency: (\d) peer\(s\) enabled, (\d+) bytes: malloc median ([\d.]+)", line)
    if m and section:
        latency.setdefault((section, int(m.group(1))), []).append((int(m.group(2)), float(m.group(3))))

fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
for policy, pts in enable.items():
    pts.sort()
    label = "native" if policy == "native" else f"vmmshim, policy {policy}"
    a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
a.set_xscale("log")
a.set_yscale("log")
a.set_xlabel("live allocations on the peer device")
a.set_ylabel("cudaDeviceEnablePeerAccess (ms, median of 5)")
a.set_title("Enabling peer access")
a.legend()
for (policy, peers), pts in sorted(latency.items()):
    pts.sort()
    label = ("native" if policy == "native" else f"vmmshim {policy}") + f", {peers} peer(s) enabled"
    b.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label,
           linestyle="-" if peers else "--")
b.set_xscale("log", base=2)
b.set_yscale("log")
b.set_xlabel("allocation size (bytes)")
b.set_ylabel("cudaMalloc median (us)")
b.set_title("cudaMalloc on device 1, repeated alloc/free")
b.legend(fontsize=7)
fig.suptitle("2 x NVIDIA H200 (NVLink, NV18), driver 580.159.04")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("wrote", sys.argv[2])

#!/usr/bin/env python3
"""Draws the chart of `vmmshim compare`: median wall time, bytes mapped into
peers and cuMemSetAccess calls per policy, native first.

    python3 compare_chart.py compare.json compare.png

Exits 3 with one line on standard error when matplotlib cannot be imported
(vmmshim compare shows that line).
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        print("usage: compare_chart.py COMPARE_JSON PNG", file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # ImportError, or a broken install
        print(f"matplotlib cannot be imported by {sys.executable}: {e}", file=sys.stderr)
        return 3
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    modes = doc["modes"]
    labels = [m["policy"] + ("" if m["failed_runs"] == 0 else "\n(FAILED)") for m in modes]
    colors = ["#888888" if m["native"] else ("#d62728" if m["failed_runs"] else "#1f77b4")
              for m in modes]

    def values(key, scale=1.0):  # None: not measured for that mode (drawn as "n/a")
        return [None if m[key] is None else m[key] * scale for m in modes]

    panels = [("wall time, median (s)", values("wall_median_seconds")),
              ("bytes mapped into peers (MiB)", values("mapped_into_peers_bytes", 1 / 2**20)),
              ("cuMemSetAccess calls", values("set_access_calls"))]
    if any(m["peak_device_bytes"] is not None for m in modes):
        panels.insert(1, ("peak device memory (MiB)", values("peak_device_bytes", 1 / 2**20)))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4))
    for ax, (title, ys) in zip(axes, panels):
        ax.bar(range(len(ys)), [y or 0 for y in ys], color=colors)
        ax.set_xticks(range(len(ys)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        for i, y in enumerate(ys):
            ax.annotate("n/a" if y is None else f"{y:.3g}", (i, y or 0), ha="center",
                        va="bottom", fontsize=8)
    command = " ".join(doc["command"])
    fig.suptitle(f"vmmshim compare: {command[:100]}\n{doc['repeat']} runs each; native has no "
                 "shim figures (natively every allocation is mapped: see 'all')", fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())

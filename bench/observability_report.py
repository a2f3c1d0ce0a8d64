#!/usr/bin/env python3
"""Prints bench/observability_bench.sh's results: per benchmark binary and size, the median
over rounds of nanoseconds per cached cudaMalloc + cudaFree pair for each variant side by
side, each round's figures for the spread, and the cost of each option per allocation
(the difference of medians):
  attribution      shim - no-attribution
  history          history - shim
  stacks           history+stacks - history
usage: observability_report.py OUTDIR
"""
import collections
import csv
import glob
import os
import statistics
import sys

VARIANTS = ["native", "no-attribution", "shim", "history", "history+stacks"]


def main():
    out = sys.argv[1]
    # (bench, bytes) -> variant -> [ns per pair, one per round]
    figures = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in sorted(glob.glob(os.path.join(out, "*.csv"))):
        bench, variant, _round, _ = os.path.basename(path).rsplit(".", 3)
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["metric"].startswith("hit_pair_ns"):
                    figures[(bench, int(row["bytes"]))][variant].append(float(row["value"]))
    if not figures:
        print("no results in", out)
        return 1
    print("Cached cudaMalloc + cudaFree pair, 1,000 allocations resident: ns per pair, "
          "median over rounds (each round's figures in brackets)")
    for (bench, size), by_variant in sorted(figures.items()):
        print(f"\n{bench}, {size} bytes")
        med = {}
        for v in VARIANTS:
            rounds = by_variant.get(v, [])
            if not rounds:
                continue
            med[v] = statistics.median(rounds)
            each = ", ".join(f"{x:.0f}" for x in rounds)
            print(f"  {v:<16} {med[v]:8.1f}   [{each}]")
        print("  cost per allocation (difference of medians, ns):")
        for label, a, b in (("attribution", "shim", "no-attribution"),
                            ("history", "history", "shim"),
                            ("call stacks (16)", "history+stacks", "history")):
            if a in med and b in med:
                spread = max(max(by_variant[a]) - min(by_variant[a]),
                             max(by_variant[b]) - min(by_variant[b]))
                print(f"    {label:<18} {med[a] - med[b]:+8.1f}   (round spread up to {spread:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

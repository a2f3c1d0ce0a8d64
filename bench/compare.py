"""Side by side: alloc_bench CSVs of several labelled runs (native, shim, and
optionally a baseline shim build), each label run in several alternating
rounds of one invocation (bench/run_bench.sh --rounds N --baseline LIB).

Prints, per row, each label's median over the rounds and its spread (the
largest relative difference between two rounds of that label), and for the
baseline the change of the new shim against it, marked "worse" only when
the difference exceeds the larger of the two spreads (noise). Writes merged
per-label CSVs (the median over rounds per row) for report.py.

usage: compare.py OUTDIR LABEL=CSV[,CSV...] ...   (labels: native, shim, baseline)
"""
import csv
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return {(r["metric"], int(r["bytes"]), int(r["threads"])): r for r in csv.DictReader(f)}


def value(row):
    m = row["metric"]
    if m == "churn_op" or m.startswith(("footprint", "replay")):
        return float(row["value"])
    return float(row["median_us"])


def higher_is_better(metric):
    return metric == "churn_op"


def main():
    out = sys.argv[1]
    runs = {}
    for arg in sys.argv[2:]:
        label, paths = arg.split("=", 1)
        runs[label] = [load(p) for p in paths.split(",")]
    keys = list(runs["native"][0].keys())
    merged = {label: {} for label in runs}
    lines = []
    worse = 0
    for key in keys:
        cells, med, spread = [], {}, {}
        for label, rounds in runs.items():
            vals = [value(r[key]) for r in rounds if key in r]
            if not vals:
                continue
            med[label] = statistics.median(vals)
            spread[label] = (max(vals) - min(vals)) / med[label] if med[label] else 0.0
            row = dict(rounds[0][key])
            if key[0] == "churn_op" or key[0].startswith(("footprint", "replay")):
                row["value"] = f"{med[label]:.3f}"
            else:
                row["median_us"] = f"{med[label]:.3f}"
                row["p99_us"] = f"{statistics.median(float(r[key]['p99_us']) for r in rounds if key in r):.3f}"
            merged[label][key] = row
            cells.append(" / ".join(f"{v:.2f}" for v in vals))
        change = ""
        if "baseline" in med and "shim" in med and med["baseline"]:
            rel = med["shim"] / med["baseline"]
            noise = max(spread.get("shim", 0), spread.get("baseline", 0))
            bad = (rel < 1 - noise) if higher_is_better(key[0]) else (rel > 1 + noise)
            change = f"{rel:.3f}x" + (" worse" if bad else "")
            worse += bad
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + f" | {change} |")
    labels = list(runs)
    print("| metric | bytes | threads | " + " | ".join(f"{l} (each round)" for l in labels) +
          " | shim vs baseline (medians; 'worse' beyond the rounds' spread) |")
    print("|---|---|---|" + "---|" * len(labels) + "---|")
    print("\n".join(lines))
    if "baseline" in runs:
        print(f"rows worse than the baseline beyond noise: {worse}")
    for label, rows in merged.items():
        with open(os.path.join(out, f"{label}-merged.csv"), "w", newline="") as f:
            fields = ["label", "metric", "bytes", "threads", "median_us", "p99_us", "value"]
            w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows.values())


if __name__ == "__main__":
    main()

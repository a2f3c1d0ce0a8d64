"""Merges the native and shim CSVs of alloc_bench into one table (markdown,
printed), results.csv and, where matplotlib is installed, chart.png.

usage: report.py NATIVE_CSV SHIM_CSV OUTDIR [--simulated]
"""
import csv
import os
import sys

TARGETS = {  # (metric, bytes) -> (limit on shim/native, what the target says)
    ("warm_pair", 256): (1.0, "at most native"),
    ("warm_pair", 65536): (1.0, "at most native"),
    ("warm_pair", 2 << 20): (0.1, "at most 0.1 x native"),
    ("warm_pair", 64 << 20): (0.1, "at most 0.1 x native"),
    ("warm_pair", 1 << 30): (0.1, "at most 0.1 x native"),
}
for b in (256, 65536, 2 << 20, 64 << 20, 1 << 30):
    TARGETS[("cold_malloc", b)] = (1.2, "at most 1.2 x native")
TARGETS[("footprint_10000x256B_MiB", 256)] = (1.2, "at most 1.2 x native")
for b in (256, 65536, 2 << 20, 64 << 20):  # with a resident set (as a framework holds)
    TARGETS[("warm_pair_resident", b)] = (0.5, "at most 0.5 x native")
TARGETS[("warm_pair_resident", 1 << 30)] = (0.1, "at most 0.1 x native")
for b in (256, 65536, 2 << 20, 64 << 20, 1 << 30):
    TARGETS[("cold_malloc_resident", b)] = (1.2, "at most 1.2 x native")
for b in (256, 1 << 20, 64 << 20):  # stream-ordered: at most native
    TARGETS[("async_pair_resident", b)] = (1.0, "at most native")
    TARGETS[("async2s_pair_resident", b)] = (1.0, "at most native")


# Targets on the shim's own figure: (metric, bytes) -> (most us, text).
ABSOLUTE = {("warm_malloc_resident", b): (0.3, "cache hit at most 0.3 us")
            for b in (256, 65536, 2 << 20, 64 << 20, 1 << 30)}
for b in (256, 65536, 2 << 20, 64 << 20, 1 << 30):
    TARGETS[("warm_free_resident", b)] = (1.0, "at most native's")
CHURN_SCALING = 4.0  # 8 threads: at least this many times the one-thread rate


def load(path):
    with open(path) as f:
        return {(r["metric"], int(r["bytes"]), int(r["threads"])): r for r in csv.DictReader(f)}


def size(b):
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
    return f"{b} B" if b else "random"


def main():
    native, shim, out = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
    simulated = "--simulated" in sys.argv
    rows = []
    for key, n in native.items():
        s = shim.get(key)
        if s is None:
            continue
        metric, b, threads = key
        if metric == "replay_total_ms":
            nv, sv, unit = float(n["value"]), float(s["value"]), "ms"
            ratio = sv / nv if nv else float("nan")
            np99 = sp99 = ""
        elif metric == "churn_op":
            nv, sv, unit = float(n["value"]), float(s["value"]), "ops/s"
            ratio = sv / nv if nv else float("nan")
            np99 = sp99 = ""
        elif metric.startswith("footprint"):
            nv, sv, unit = float(n["value"]), float(s["value"]), "MiB"
            ratio = sv / nv if nv else float("nan")
            np99 = sp99 = ""
        else:
            nv, sv, unit = float(n["median_us"]), float(s["median_us"]), "us"
            ratio = sv / nv if nv else float("nan")
            np99, sp99 = n["p99_us"], s["p99_us"]
        target = TARGETS.get((metric, b))
        verdict = ""
        if target and not simulated:
            limit, text = target
            verdict = f"{text}: " + ("met" if ratio <= limit else f"MISSED ({ratio / limit:.2f}x the limit)")
        absolute = ABSOLUTE.get((metric, b))
        if absolute and not simulated:
            limit, text = absolute
            verdict += ("; " if verdict else "") + f"{text}: " + (
                "met" if sv <= limit else f"MISSED ({sv / limit:.2f}x the limit)")
        if metric == "churn_op" and threads == 8 and not simulated:
            one = shim.get(("churn_op", 0, 1))
            if one is not None and float(one["value"]) > 0:
                scale = sv / float(one["value"])
                verdict = (f"8 threads at least {CHURN_SCALING:g}x the shim's one-thread rate: "
                           + ("met" if scale >= CHURN_SCALING else "MISSED") + f" ({scale:.2f}x)")
        rows.append([metric, size(b), threads, unit, nv, np99, sv, sp99, ratio, verdict])
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "size", "threads", "unit", "native_median", "native_p99",
                    "shim_median", "shim_p99", "shim_over_native", "target"])
        w.writerows(rows)
    if simulated:
        print("Simulated driver (host memory): a smoke run; these figures say nothing about GPUs.")
    print("| metric | size | threads | unit | native median | native p99 | shim median | "
          "shim p99 | shim/native | target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.2f} | {r[5]} | {r[6]:.2f} | {r[7]} | "
              f"{r[8]:.3f} | {r[9]} |")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(matplotlib not installed: no chart; table in {out}/results.csv)")
        return
    lat = [r for r in rows if r[3] == "us"]
    labels = [f"{r[0]}\n{r[1]}" for r in lat]
    fig, ax = plt.subplots(figsize=(max(8, len(lat) * 0.6), 5))
    x = range(len(lat))
    ax.bar([i - 0.2 for i in x], [r[4] for r in lat], width=0.4, label="native")
    ax.bar([i + 0.2 for i in x], [r[6] for r in lat], width=0.4, label="vmmshim")
    ax.set_yscale("log")
    ax.set_ylabel("median latency (us, log scale)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.legend()
    ax.set_title("cudaMalloc / cudaFree: native vs vmmshim" + (" (SIMULATED)" if simulated else ""))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "chart.png"), dpi=110)
    print(f"chart: {out}/chart.png")
    churn = sorted((r for r in rows if r[0] == "churn_op"), key=lambda r: r[2])
    if churn:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r[2] for r in churn], [r[4] for r in churn], "o-", label="native")
        ax.plot([r[2] for r in churn], [r[6] for r in churn], "o-", label="vmmshim")
        ax.set_xlabel("threads")
        ax.set_ylabel("operations per second (all threads)")
        ax.set_yscale("log")
        ax.set_xticks([r[2] for r in churn])
        ax.legend()
        ax.set_title("churn: random sizes 256 B - 8 MiB" + (" (SIMULATED)" if simulated else ""))
        fig.tight_layout()
        fig.savefig(os.path.join(out, "chart-churn.png"), dpi=110)
        print(f"chart: {out}/chart-churn.png")


if __name__ == "__main__":
    main()

"""Charts and tables of a tools/gpu/multi-gpu-run.sh log (docs/multi-gpu.md).

usage: python3 tools/docs/plot_multi_gpu.py LOG [LOG ...] PNG_PREFIX [--title TEXT]

Writes PNG_PREFIX-overhead.png (cudaDeviceEnablePeerAccess against live
allocations, cache-hit cudaMalloc), PNG_PREFIX-cold.png (cold cudaMalloc
against the number of peers enabled, one panel per size) and
PNG_PREFIX-pool.png (cudaMallocAsync from a pool accessible to k peers), each
only when the log has its lines, and prints Markdown tables of sections 6, 7
and 8 (cold allocations and frees, enabling every pair, pools). Several logs
(the calls of one machine split by SECTIONS) are read as one. Each timed mode ran twice (rounds 1 and 2): charts show
the mean of the two medians with the two as the error bar, tables both.
Needs matplotlib for the charts; the tables are printed without it.
Also reads the two-GPU log of the first version ("-- POLICY: enable: ...")."""
import argparse
import re
from collections import defaultdict

HEADER = re.compile(r"^-- (\S+)(?: \(round (\d)\))?$")
ENABLE = re.compile(r"enable: (\d+) live allocations on the peer: cudaDeviceEnablePeerAccess "
                    r"median ([\d.]+) us")
LATENCY = re.compile(r"latency: (\d) peer\(s\) enabled, (\d+) bytes: malloc median ([\d.]+)")
COLD = re.compile(r"cold: (\d+) peer\(s\) enabled, (\d+) bytes: malloc median ([\d.]+) p90 "
                  r"([\d.]+) us, free median ([\d.]+) p90 [\d.]+ us; "
                  r"(?:shim cache release before each median ([\d.]+))?")
POOL = re.compile(r"pool: (\d+) peer\(s\) with pool access, (\d+) bytes: cold malloc median "
                  r"([\d.]+) p90 ([\d.]+) us, warm median ([\d.]+)")
ENABLE_ALL = re.compile(r"enable-all: round (\d), (\d+) GPUs, (\d+) live allocations each: (\d+) "
                        r"ordered pairs, (\d+) enabled, (\d+) refused, (\d+) not peer-capable; "
                        r"total ([\d.]+) ms, slowest ([\d.]+) ms")
REFUSED = re.compile(r"enable-all: round (\d) refused (.*)")


def parse(text):
    """{kind: {key tuple: [values, one per round]}} and the refused lines."""
    data = defaultdict(lambda: defaultdict(list))
    refused = defaultdict(list)
    mode = None
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            mode = m.group(1)
            continue
        old = re.match(r"-- (\S+): (enable: .*)", line)  # first version's format
        if old:
            mode, line = old.group(1), old.group(2)
        if mode is None:
            continue
        if m := ENABLE.search(line):
            data["enable"][(mode, int(m[1]))].append(float(m[2]) / 1000)
        elif m := LATENCY.search(line):
            data["latency"][(mode, int(m[1]), int(m[2]))].append(float(m[3]))
        elif m := COLD.search(line):
            data["cold"][(mode, int(m[1]), int(m[2]))].append(float(m[3]))
            # The shim's free goes to its cache; the release before the next
            # allocation is what a native cudaFree does in its own time.
            free = float(m[5]) + (float(m[6]) if m[6] else 0.0)
            data["cold_free"][(mode, int(m[1]), int(m[2]))].append(free)
        elif m := POOL.search(line):
            data["pool"][(mode, int(m[1]), int(m[2]))].append(float(m[3]))
            data["pool_warm"][(mode, int(m[1]), int(m[2]))].append(float(m[5]))
        elif m := ENABLE_ALL.search(line):
            if m[1] == "1":  # the first enables of the process: what a program pays
                data["enable_all"][(mode,)].append(
                    (float(m[8]), float(m[9]), int(m[5]), int(m[6]), int(m[4])))
        elif m := REFUSED.search(line):
            if m[1] == "1":
                refused[mode].append(m[2])
    return data, refused


def size_name(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def modes_of(series):
    order = ["native", "all", "none", "min-size", "rules", "all-emulated"]
    found = {k[0] for k in series}
    return [m for m in order if m in found] + sorted(found - set(order))


def rounds(values, digits=1):
    return " / ".join(f"{v:.{digits}f}" for v in values)


def print_tables(data, refused):
    for kind, title in (("cold", "cold cudaMalloc on device 0 (us, median of each round)"),
                        ("cold_free", "its cudaFree; for the shim cudaFree + the release of "
                                      "the cache that gives the block back (us)"),
                        ("pool", "cold cudaMallocAsync from device 0's default pool (us)"),
                        ("pool_warm", "warm cudaMallocAsync, pool reuse (us)")):
        series = data.get(kind)
        if not series:
            continue
        modes = modes_of(series)
        print(f"\n{title}\n")
        print("| size | peers | " + " | ".join(modes) + " |")
        print("|---|---|" + "---|" * len(modes))
        for size in sorted({k[2] for k in series}):
            for peers in sorted({k[1] for k in series}):
                cells = [rounds(series.get((m, peers, size), []),
                                2 if kind == "pool_warm" else 1) or "-" for m in modes]
                print(f"| {size_name(size)} | {peers} | " + " | ".join(cells) + " |")
    if data.get("enable_all"):
        print("\ncudaDeviceEnablePeerAccess for every ordered pair, first round of each run\n")
        print("| mode | pairs | enabled | refused | total ms | slowest ms |")
        print("|---|---|---|---|---|---|")
        for (mode,), runs in data["enable_all"].items():
            print(f"| {mode} | {runs[0][4]} | {rounds([r[2] for r in runs], 0)} | "
                  f"{rounds([r[3] for r in runs], 0)} | {rounds([r[0] for r in runs], 2)} | "
                  f"{rounds([r[1] for r in runs], 2)} |")
        for mode, lines in refused.items():
            print(f"- {mode} refused: {'; '.join(sorted(set(lines)))}")


def plot(data, prefix, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def line(ax, xs, ys, label, style="-"):
        mean = [sum(v) / len(v) for v in ys]
        err = [[m - min(v) for m, v in zip(mean, ys)], [max(v) - m for m, v in zip(mean, ys)]]
        ax.errorbar(xs, mean, yerr=err, marker="o", label=label, linestyle=style, capsize=3)

    def label(mode):
        return "native" if mode == "native" else f"vmmshim {mode}"

    written = []
    if data.get("enable") or data.get("latency"):
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
        for mode in modes_of(data["enable"]):
            pts = sorted((k[1], v) for k, v in data["enable"].items() if k[0] == mode)
            line(a, [p[0] for p in pts], [p[1] for p in pts], label(mode))
        a.set(xscale="log", yscale="log", xlabel="live allocations on the peer device",
              ylabel="cudaDeviceEnablePeerAccess (ms, median of 5)", title="Enabling peer access")
        a.legend()
        for mode in modes_of(data["latency"]):
            for peers in (0, 1):
                pts = sorted((k[2], v) for k, v in data["latency"].items()
                             if k[0] == mode and k[1] == peers)
                if pts:
                    line(b, [p[0] for p in pts], [p[1] for p in pts],
                         f"{label(mode)}, {peers} peer(s)", "-" if peers else "--")
        b.set_xscale("log", base=2)
        b.set(yscale="log", xlabel="allocation size (bytes)", ylabel="cudaMalloc median (us)",
              title="cudaMalloc on device 1, repeated alloc/free (cache hits)")
        b.legend(fontsize=7)
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(f"{prefix}-overhead.png", dpi=110)
        written.append(f"{prefix}-overhead.png")
    for kind, what in (("cold", "cold cudaMalloc on device 0"),
                       ("pool", "cold cudaMallocAsync, device 0's default pool")):
        series = data.get(kind)
        if not series:
            continue
        sizes = sorted({k[2] for k in series})
        fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 4), squeeze=False)
        for ax, size in zip(axes[0], sizes):
            for mode in modes_of(series):
                pts = sorted((k[1], v) for k, v in series.items() if k[0] == mode and k[2] == size)
                line(ax, [p[0] for p in pts], [p[1] for p in pts], label(mode))
            ax.set(xlabel="peers enabled" if kind == "cold" else "peers with pool access",
                   ylabel="median latency (us)", title=size_name(size))
            ax.set_ylim(bottom=0)
            ax.set_xticks(sorted({k[1] for k in series}))
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"{what}: {title}")
        fig.tight_layout()
        fig.savefig(f"{prefix}-{kind}.png", dpi=110)
        written.append(f"{prefix}-{kind}.png")
    for w in written:
        print("wrote", w)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", nargs="+")
    parser.add_argument("prefix")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    data, refused = parse("\n".join(open(log).read() for log in args.log))
    print_tables(data, refused)
    try:
        plot(data, args.prefix, args.title)
    except ImportError as e:
        print(f"no charts: {e}")


if __name__ == "__main__":
    main()

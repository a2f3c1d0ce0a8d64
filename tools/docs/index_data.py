#!/usr/bin/env python3
"""Writes docs/data/README.md: an index of the recorded runs in docs/data,
one row per file: the GPU it ran on (from its name: h100, h200, or "cpu"
for the simulated driver and host-only runs), the commit that added it (the
tree it was run on, or the one just after), that commit's subject (what the
run was for), and the docs that cite it. A file no doc cites is marked so:
the candidates for removal when a later run supersedes them.
usage: python3 tools/docs/index_data.py   (from anywhere in the repository)"""
import os
import re
import subprocess

root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                      check=True).stdout.strip()
data = os.path.join(root, "docs", "data")
docs = []
for base in ("docs", "README.md", "bench", "tools", "tests"):
    path = os.path.join(root, base)
    if os.path.isfile(path):
        docs.append(path)
        continue
    for d, _, files in os.walk(path):
        if os.path.abspath(d).startswith(data):
            continue
        docs += [os.path.join(d, f) for f in files if f.endswith((".md", ".sh", ".py"))]
texts = {p: open(p, errors="replace").read() for p in docs}


def added(name):
    """(short hash, date, subject) of the commit that added docs/data/NAME."""
    out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h%x09%ad%x09%s",
                          "--date=short", "--", f"docs/data/{name}"],
                         cwd=root, capture_output=True, text=True).stdout.strip().splitlines()
    if not out:
        return ("-", "-", "(not committed yet)")
    h, date, subject = out[-1].split("\t", 2)
    return h, date, subject


def gpu(name):
    for g in ("h100", "h200"):
        if re.search(rf"(^|[-_.]){g}([-_.]|$)", name):
            return g.upper()
    return "cpu"


rows = []
for name in sorted(os.listdir(data)):
    if name == "README.md" or os.path.isdir(os.path.join(data, name)):
        continue
    h, date, subject = added(name)
    cited = sorted(os.path.relpath(p, root) for p, t in texts.items() if name in t)
    what = subject if len(subject) <= 140 else subject[:137] + "..."
    rows.append(f"| `{name}` | {gpu(name)} | {date} `{h}` | {what.replace('|', '/')} | "
                f"{', '.join(cited) if cited else '**cited by no doc**'} |")

with open(os.path.join(data, "README.md"), "w") as f:
    f.write("# docs/data: the recorded runs\n\n"
            "Logs and tables of runs on real GPUs and on the simulated driver, each cited where a\n"
            "figure is claimed. One row per file: the GPU (from its name), the commit that added it\n"
            "(the tree it ran on, or the one right after) and that commit's subject, and the files\n"
            "that cite it. Written by `tools/docs/index_data.py`; run it after adding a run. A file\n"
            "cited by no doc is a candidate for removal once a later run supersedes it.\n\n"
            "| file | GPU | added | what | cited by |\n|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
print(f"{len(rows)} files indexed in docs/data/README.md "
      f"({sum('cited by no doc' in r for r in rows)} cited by no doc)")

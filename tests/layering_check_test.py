#!/usr/bin/env python3
"""The layering check fails on what it is meant to catch: an include of a higher room, an
unlisted callback and an unlisted upward interface, each planted in a copy of core/ (nested
folders such as core/peer/enable too).
usage: layering_check_test.py SOURCE_DIR
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile

PLANTS = {
    "an include of a higher room": (
        "core/heap/heap_table.h", '#include "core/allocator.h"\n', "crosses the layering"),
    "an include of a nested room above": (
        "core/peer/policy/peer_policy.h", '#include "core/peer/enable/peer_grants.h"\n',
        "crosses the layering"),
    "an include from a nested room of a room above it": (
        "core/peer/enable/peer_grants.h", '#include "core/memory_control.h"\n',
        "crosses the layering"),
    "an unlisted callback": (
        "core/heap/heap_table.h", "namespace vmmshim {\nusing PlantedHook = std::function<void()>;\n",
        "callback 'PlantedHook' is not in ALLOWED_CALLBACKS"),
    "an unlisted upward interface": (
        "core/ipc/ipc.h", "namespace vmmshim {\nclass Planted : public PauseParticipant {};\n",
        "Planted implements PauseParticipant of core/heap"),
}


def run(source):
    check = pathlib.Path(__file__).with_name("layering_check.py")
    return subprocess.run([sys.executable, str(check), str(source)], capture_output=True,
                          text=True)


def main():
    source = pathlib.Path(sys.argv[1])
    failures = []
    clean = run(source)
    if clean.returncode != 0:
        failures.append(f"the tree itself fails the check:\n{clean.stdout}")
    for what, (rel, text, expected) in PLANTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp)
            shutil.copytree(source / "core", copy / "core")
            target = copy / rel
            body = target.read_text()
            if text.startswith("namespace vmmshim {\n"):
                body = body.replace("namespace vmmshim {\n", text, 1)
            else:
                body = text + body
            target.write_text(body)
            r = run(copy)
            if r.returncode == 0 or expected not in r.stdout:
                failures.append(f"{what} in {rel} was not caught (exit {r.returncode}):\n{r.stdout}")
    for f in failures:
        print(f)
    if failures:
        return 1
    print(f"the layering check caught each of {len(PLANTS)} planted violations")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The calling process's device memory as nvidia-smi sees it, for the
examples that compare memory before and after a pause (sleep_wake.py,
sleep_whole_process.py)."""
import os
import subprocess


def smi_used_mib():
    """This process's device memory as nvidia-smi sees it, in MiB (-1: unknown)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30).stdout
        for line in out.splitlines():
            pid, used = [f.strip() for f in line.split(",")]
            if int(pid) == os.getpid():
                return int(used)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    return -1

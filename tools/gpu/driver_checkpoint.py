#!/usr/bin/env python3
"""The driver's process checkpoint alone, as NVIDIA's cuda-checkpoint tool
calls it (cuCheckpointProcessLock + Checkpoint to sleep, Restore + Unlock to
wake), for the baseline of tools/gpu/deep-sleep.sh.
usage: driver_checkpoint.py sleep|wake PID   (prints the seconds)"""
import ctypes
import sys
import time


class LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


def main():
    what, pid = sys.argv[1], int(sys.argv[2])
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    start = time.perf_counter()
    if what == "sleep":
        args = LockArgs(timeoutMs=10000)
        calls = [("lock", lambda: cu.cuCheckpointProcessLock(pid, ctypes.byref(args))),
                 ("checkpoint", lambda: cu.cuCheckpointProcessCheckpoint(pid, None))]
    else:
        calls = [("restore", lambda: cu.cuCheckpointProcessRestore(pid, None)),
                 ("unlock", lambda: cu.cuCheckpointProcessUnlock(pid, None))]
    for name, call in calls:
        rc = call()
        if rc != 0:
            sys.exit(f"driver_checkpoint {what} {pid}: {name} failed: CUDA error {rc}")
    print(f"driver_checkpoint {what} {pid}: {time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What the driver's process checkpoint (cuCheckpointProcess*, as cuda-checkpoint
calls it) costs a process for the page-locked host memory it holds, by the way
that memory was made: the question behind a pinned pool that survives a deep
sleep cheaply (docs/deep-sleep-design.md, "Measured on the H200": 20 GiB registered
with cuMemHostRegister added about 0.4 s to the checkpoint and 0.4-0.55 s to
the restore).

Natively (no shim), one process per run holding a 256 MiB device buffer and
--gib GiB of host memory made one way:
  none        no page-locked memory (the floor)
  register    MADV_HUGEPAGE memory written, then cuMemHostRegister (portable):
              how the pinned pool is made
  dropped     the same, then cuMemHostUnregister before the checkpoint: plain
              memory that was page-locked (a pool that gives its pinning back)
  host_alloc  cuMemHostAlloc (portable)
  vmm_host    cuMemCreate of host memory (CU_MEM_LOCATION_TYPE_HOST_NUMA, node
              0), reserved, mapped and made accessible to the device
Each run: the driver's lock + checkpoint, then restore + unlock
(tools/gpu/driver_checkpoint.py), timed; the device buffer's and host memory's
contents checked after the wake. The ways alternate, ROUNDS rounds.
usage: python3 tools/gpu/checkpoint_host_memory.py [--gib 20] [--rounds 2]
       [--ways none,register,dropped,host_alloc,vmm_host]"""
import argparse
import ctypes
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def check(rc, what):
    if rc != 0:
        sys.exit(f"checkpoint_host_memory: {what} failed: CUDA error {rc}")


def primary_context(cu):
    """cuInit, and device 0's primary context made current."""
    check(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def page_locked_huge_pages(cu, libc, n):
    """n bytes of MADV_HUGEPAGE memory, written (0x33), then cuMemHostRegister
    (portable): how the pinned pool is made. Returns the address."""
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    host = libc.mmap(None, n, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    libc.madvise(ctypes.c_void_p(host), ctypes.c_size_t(n), 14)  # MADV_HUGEPAGE
    ctypes.memset(host, 0x33, n)
    check(cu.cuMemHostRegister_v2(ctypes.c_void_p(host), ctypes.c_size_t(n), 1),
          "cuMemHostRegister")
    return host


def child(way, gib):
    cu = ctypes.CDLL("libcuda.so.1")
    libc = ctypes.CDLL(None, use_errno=True)
    primary_context(cu)
    device = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(device), ctypes.c_size_t(256 << 20)), "cuMemAlloc")
    check(cu.cuMemsetD8_v2(device, ctypes.c_ubyte(0x5a), ctypes.c_size_t(256 << 20)), "cuMemsetD8")
    n = int(gib * (1 << 30))
    host = None
    if way in ("register", "dropped"):
        host = page_locked_huge_pages(cu, libc, n)
        if way == "dropped":
            check(cu.cuMemHostUnregister(ctypes.c_void_p(host)), "cuMemHostUnregister")
    elif way == "host_alloc":
        p = ctypes.c_void_p()
        check(cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), 1), "cuMemHostAlloc")
        host = p.value
        ctypes.memset(host, 0x33, n)
    elif way == "vmm_host":
        prop = AllocationProp(type=1, location=Location(type=3, id=0))  # PINNED, HOST_NUMA 0
        gran = ctypes.c_size_t()
        check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0),
              "cuMemGetAllocationGranularity")
        n = (n + gran.value - 1) // gran.value * gran.value
        handle, va = ctypes.c_uint64(), ctypes.c_uint64()
        check(cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(n), ctypes.byref(prop),
                             ctypes.c_ulonglong(0)), "cuMemCreate (host)")
        check(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(n), gran,
                                     ctypes.c_uint64(0), ctypes.c_ulonglong(0)),
              "cuMemAddressReserve")
        check(cu.cuMemMap(va, ctypes.c_size_t(n), ctypes.c_size_t(0), handle,
                          ctypes.c_ulonglong(0)), "cuMemMap")
        access = (AccessDesc * 2)(AccessDesc(Location(1, 0), 3), AccessDesc(Location(3, 0), 3))
        check(cu.cuMemSetAccess(va, ctypes.c_size_t(n), access, ctypes.c_size_t(2)),
              "cuMemSetAccess")
        host = va.value
        ctypes.memset(host, 0x33, n)
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    print("ready", os.getpid(), flush=True)
    sys.stdin.readline()  # the parent's sleep and wake happen meanwhile
    probe = (ctypes.c_ubyte * 16)()
    check(cu.cuMemcpyDtoH_v2(probe, device, ctypes.c_size_t(16)), "cuMemcpyDtoH")
    intact = all(b == 0x5a for b in probe)
    if host is not None:
        intact &= all(ctypes.string_at(host + off, 16) == b"\x33" * 16
                      for off in (0, n // 2, n - 16))
    print("intact" if intact else "DIFFERS", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=["none", "register", "dropped", "host_alloc",
                                                 "vmm_host"])
    parser.add_argument("--gib", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ways", default="none,register,dropped,host_alloc,vmm_host")
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.gib)
    failed = 0
    for rnd in range(1, args.rounds + 1):
        for way in args.ways.split(","):
            start = time.perf_counter()
            p = subprocess.Popen([sys.executable, __file__, "--child", way, "--gib", str(args.gib)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline()
            made = time.perf_counter() - start
            if not line.startswith("ready"):
                print(f"{way} round {rnd}: did not start", flush=True)
                failed += 1
                p.kill()
                continue
            pid = line.split()[1]
            times = []
            for what in ("sleep", "wake"):
                r = subprocess.run([sys.executable, os.path.join(HERE, "driver_checkpoint.py"),
                                    what, pid], capture_output=True, text=True, timeout=120)
                times.append(r.stdout.strip().split()[-2] if r.returncode == 0
                             else f"failed ({r.stdout.strip()} {r.stderr.strip()})")
            p.stdin.write("go\n")
            p.stdin.flush()
            result = p.stdout.readline().strip()
            p.wait(timeout=120)
            failed += result != "intact"
            print(f"{way} {args.gib:g} GiB round {rnd}: made in {made:.2f} s (process start "
                  f"included); checkpoint {times[0]} s, restore {times[1]} s; {result}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Whether the driver's page-locking (cuMemHostRegister, as the shim's pinned
pool makes it; cuMemHostAlloc) is held to RLIMIT_MEMLOCK (`ulimit -l`), the
question behind the pinned pool's limits (core/heap/pinned_pool.h cuts a pool
to the host memory left, not to the memlock limit). Natively, with the limit
lowered to --limit-kib (default 64) in this process (setrlimit, soft and
hard), registers --mib MiB (default 512) of fresh anonymous memory and
allocates as much with cuMemHostAlloc; prints each result and the limit.
usage: python3 tools/gpu/memlock-probe.py [--limit-kib 64] [--mib 512]"""
import argparse
import ctypes
import mmap
import resource

parser = argparse.ArgumentParser()
parser.add_argument("--limit-kib", type=int, default=64)
parser.add_argument("--mib", type=int, default=512)
args = parser.parse_args()
limit = args.limit_kib << 10
resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))
print(f"RLIMIT_MEMLOCK: {resource.getrlimit(resource.RLIMIT_MEMLOCK)} bytes")
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
n = args.mib << 20
buf = mmap.mmap(-1, n)
buf.write(b"\1" * n)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
CU_MEMHOSTREGISTER_PORTABLE = 1
r = cu.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(n), CU_MEMHOSTREGISTER_PORTABLE)
print(f"cuMemHostRegister of {args.mib} MiB under a {args.limit_kib} KiB memlock limit: {r}"
      + (" (registered: the limit does not hold it)" if r == 0 else " (refused)"))
if r == 0:
    cu.cuMemHostUnregister(ctypes.c_void_p(addr))
p = ctypes.c_void_p()
r = cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), 1)
print(f"cuMemHostAlloc of {args.mib} MiB under a {args.limit_kib} KiB memlock limit: {r}"
      + (" (allocated: the limit does not hold it)" if r == 0 else " (refused)"))
if r == 0:
    cu.cuMemFreeHost(p)

"""CuPy's MemoryAsyncPool figures (total_bytes: the pool's reserved bytes,
CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT; used_bytes; free_bytes: reserved minus
used) through a sequence of small and large stream-ordered allocations and
frees, to compare with and without LD_PRELOAD=libvmmshim.so
(docs/stream-ordered.md, "Reserved bytes"). Lines starting "PARITY" say what
must hold in both (the driver's behaviour); "INFO" lines carry the raw
figures, whose chunk sizes differ by design (the driver's 32 MiB, the shim's
packed block)."""
import cupy

MIB = 1 << 20
pool = cupy.cuda.MemoryAsyncPool()
cupy.cuda.set_allocator(pool.malloc)
dev = cupy.cuda.Device()


def figures(when):
    dev.synchronize()
    total, used, free = pool.total_bytes(), pool.used_bytes(), pool.free_bytes()
    print(f"INFO {when}: total {total} used {used} free {free}")
    return total, used, free


figures("start")
a = cupy.empty(4096, dtype=cupy.uint8)
t1, u1, f1 = figures("one 4 KiB array")
b = cupy.empty(64 * 1024, dtype=cupy.uint8)
t2, u2, f2 = figures("and a 64 KiB array")
print(f"PARITY first small allocation reserves a chunk larger than itself: {t1 > u1}")
print(f"PARITY a second small one leaves the reserved bytes as they are: {t2 == t1}")
print(f"PARITY and takes its size from the free bytes: {f1 - f2 == 64 * 1024}")
c = cupy.empty(256 * MIB, dtype=cupy.uint8)
t3, u3, f3 = figures("and a 256 MiB array")
print(f"PARITY a large one reserves at least its size more: {t3 - t2 >= 256 * MIB}")
del a, b, c
t4, u4, f4 = figures("all freed, synchronized (release threshold 0)")
print(f"PARITY nothing used after the frees: {u4 == 0}")
print(f"PARITY the reservation given back: {t4 == 0}")

"""CuPy on its stream-ordered allocator (cupy.cuda.MemoryAsyncPool: every
array is cudaMallocFromPoolAsync on the current pool, freed with
cudaFreeAsync), on the null stream and on a created stream. Prints an exact
checksum (integer arithmetic) that must be identical with and without
LD_PRELOAD=libvmmshim.so, and the time of the loop."""
import time

import cupy

pool = cupy.cuda.MemoryAsyncPool()
cupy.cuda.set_allocator(pool.malloc)
x = cupy.arange(1 << 20, dtype=cupy.int64)
for _ in range(20):  # warm-up: kernels compiled and cached
    int(((x * 3 + 1) % 1009).sum())
cupy.cuda.Device().synchronize()
t0 = time.perf_counter()
total = 0
stream = cupy.cuda.Stream(non_blocking=True)
for i in range(1000):
    with stream if i % 2 else cupy.cuda.Stream.null:
        y = (x * (i % 7) + 1) % 1009       # new arrays each iteration
        z = y[: (1 << 10) * (1 + i % 512)] * 2
        total += int(z.sum()) + int(y.max())
cupy.cuda.Device().synchronize()
print(f"cupy_async: checksum {total} ({(time.perf_counter() - t0) * 1e3:.1f} ms for 1000 iterations)")
print(f"cupy_async: pool used {pool.used_bytes()} bytes after the loop")

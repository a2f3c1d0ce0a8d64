"""CuPy with its memory pool off: every array is a cudaMalloc/cudaFree. Times
a loop of element-wise work on fresh arrays (native vs shim comparison)."""
import time

import cupy

import tms_region

tms_region.enter_if_preloaded()  # no-op unless torch_memory_saver is preloaded

cupy.cuda.set_allocator(None)
cupy.cuda.set_pinned_memory_allocator(None)
x = cupy.arange(1 << 20, dtype=cupy.float32)
for _ in range(50):  # warm-up: kernels compiled and cached
    (x * 2 + 1).sum()
cupy.cuda.Device().synchronize()
t0 = time.perf_counter()
total = 0.0
for i in range(2000):
    y = x * (i % 7) + 1          # new arrays each iteration
    z = cupy.sqrt(y) - y / 3
    total += float(z[:4].sum())
cupy.cuda.Device().synchronize()
print(f"cupy_nopool: {(time.perf_counter() - t0) * 1e3:.1f} ms for 2000 iterations, checksum {total:.3f}")

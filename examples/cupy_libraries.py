"""CuPy with its memory pool off, calling into cuBLAS and cuFFT: every array is a
cudaMalloc of CuPy's, and the libraries make allocations of their own (workspaces,
plans). Under the shim with VMMSHIM_SNAPSHOT_FILE the snapshot names each
allocation's library (docs/memory-snapshots.md). Prints checksums, identical with and
without the shim.
    python3 examples/cupy_libraries.py
"""
import cupy

cupy.cuda.set_allocator(None)  # no pool: CuPy's arrays are cudaMalloc calls
cupy.cuda.set_pinned_memory_allocator(None)

rng = cupy.random.default_rng(1234)
a = rng.standard_normal((2048, 2048), dtype=cupy.float32)
b = rng.standard_normal((2048, 2048), dtype=cupy.float32)
c = a @ b                                   # cuBLAS
spectrum = cupy.fft.rfft2(c)                # cuFFT (a plan with its work area)
order = cupy.argsort(c[:, 0])               # CUB through CuPy
weights = [cupy.full((1 << 20,), i, dtype=cupy.float32) for i in range(16)]
cupy.cuda.Device().synchronize()
print(f"matmul {float(c.sum()):.6e} fft {float(cupy.abs(spectrum).sum()):.6e} "
      f"sort {int(order[:8].sum())} weights {float(sum(w.sum() for w in weights)):.1f}")

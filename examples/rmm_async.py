"""RAPIDS RMM's stream-ordered memory resources under CuPy: every array is
allocated by RMM (rmm.allocators.cupy), which calls cudaMallocAsync.
  --resource view   cuda_async_view_memory_resource on the device's default
                    pool: served from VMM by the shim;
  --resource async  cuda_async_memory_resource, which creates its own pool
                    (cudaMemPoolCreate): the driver's, passed through.
Prints an exact checksum that must be identical with and without
LD_PRELOAD=libvmmshim.so."""
import argparse
import time

import cupy
import rmm
from cuda.bindings import runtime
from rmm.allocators.cupy import rmm_cupy_allocator

parser = argparse.ArgumentParser()
parser.add_argument("--resource", choices=["view", "async"], default="view")
args = parser.parse_args()
if args.resource == "view":
    err, pool = runtime.cudaDeviceGetDefaultMemPool(0)
    assert err == runtime.cudaError_t.cudaSuccess, err
    mr = rmm.mr.CudaAsyncViewMemoryResource(pool)
else:
    mr = rmm.mr.CudaAsyncMemoryResource(initial_pool_size=1 << 28)
rmm.mr.set_current_device_resource(mr)
cupy.cuda.set_allocator(rmm_cupy_allocator)

x = cupy.arange(1 << 20, dtype=cupy.int64)
for _ in range(20):  # warm-up
    int(((x * 3 + 1) % 1009).sum())
cupy.cuda.Device().synchronize()
t0 = time.perf_counter()
total = 0
for i in range(1000):
    y = (x * (i % 7) + 1) % 1009
    z = y[: (1 << 10) * (1 + i % 512)] * 2
    total += int(z.sum()) + int(y.max())
    buf = rmm.DeviceBuffer(size=(i % 64 + 1) << 16)  # RMM's own buffers too
    total += buf.size
cupy.cuda.Device().synchronize()
print(f"rmm_async ({args.resource}): checksum {total} "
      f"({(time.perf_counter() - t0) * 1e3:.1f} ms for 1000 iterations)")

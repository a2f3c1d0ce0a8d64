"""PyTorch reaching the GPU through each of its libraries once: cuBLAS (a bf16 matmul),
cuDNN (a convolution), NCCL (a one-rank all-reduce), Triton (a torch.compile'd function)
and its own kernels and copies on a side stream with events. Under the shim with
VMMSHIM_LOG_LEVEL=debug the log holds every driver entry point these resolve
(tools/gpu/resolved-entry-points.sh). Prints one checksum line per library.
    python3 examples/torch_library_mix.py [--no-compile]
"""
import os
import sys

import torch
import torch.distributed as dist

torch.manual_seed(0)
dev = "cuda"
a = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
print("cublas", float((a @ a).float().sum()))

torch.backends.cudnn.enabled = True
x = torch.randn(8, 16, 64, 64, device=dev)
w = torch.randn(32, 16, 3, 3, device=dev)
print("cudnn", float(torch.nn.functional.conv2d(x, w, padding=1).sum()))

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29571")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device(dev, 0))
t = torch.arange(1 << 20, device=dev, dtype=torch.float32)
dist.all_reduce(t)
torch.cuda.synchronize()
print("nccl", float(t.sum()))
dist.destroy_process_group()

side = torch.cuda.Stream()
host = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
done = torch.cuda.Event()
with torch.cuda.stream(side):
    d = host.to(dev, non_blocking=True) * 2
    done.record()
torch.cuda.current_stream().wait_event(done)
print("copies", float(d.sum()))

if "--no-compile" not in sys.argv:
    @torch.compile
    def fused(u, v):
        return torch.sin(u) * v + u.exp()
    u = torch.randn(1 << 16, device=dev)
    print("triton", float(fused(u, u).sum()))

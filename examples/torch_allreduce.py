"""Two processes, one GPU each, all-reduce with NCCL through torch.distributed;
prints the result, which must be the sum over ranks. Run with and without
LD_PRELOAD=libvmmshim.so (the children inherit it)."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world):
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=rank,
                            world_size=world)
    torch.cuda.set_device(rank)
    t = torch.full((1 << 20,), float(rank + 1), device=f"cuda:{rank}")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    want = sum(range(1, world + 1))
    ok = bool((t == want).all().item())
    print(f"torch_allreduce: rank {rank} value {t[0].item():.1f} want {want} {'ok' if ok else 'WRONG'}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world = torch.cuda.device_count()
    if world < 2:
        print("torch_allreduce: needs two GPUs")
        raise SystemExit(0)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(run, args=(world,), nprocs=world, join=True)

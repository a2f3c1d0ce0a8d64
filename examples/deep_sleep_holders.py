"""A PyTorch process holding what the driver's process checkpoint may not
take, for `vmmshim sleep` (docs/deep-sleep.md, "What the checkpoint cannot
take"), run under LD_PRELOAD=libvmmshim.so:
  --holds nccl      a one-rank NCCL process group after an all-reduce of a
                    1 GiB tensor (NCCL's own buffers and communicator)
  --holds exported  a 1 GiB tensor exported with cudaIpcGetMemHandle (what
                    torch.multiprocessing does to share it), whose handle no
                    other process needs to open for the export to exist
Prints "ready PID", then answers one command per line on standard input:
  result  "result ..." (the all-reduce done again, or the tensor's digest)
  quit    ends
so that a controller can sleep and wake it in between and compare.
"""
import argparse
import hashlib
import os
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--holds", choices=["nccl", "exported"], required=True)
    args = parser.parse_args()
    import torch
    x = torch.arange(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    if args.holds == "nccl":
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("nccl", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        dist.all_reduce(x)
    else:
        x.untyped_storage()._share_cuda_()  # cudaIpcGetMemHandle of its memory
    torch.cuda.synchronize()

    def result():
        if args.holds == "nccl":
            import torch.distributed as dist
            dist.all_reduce(x)  # one rank: x as it was
        torch.cuda.synchronize()
        return hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest()[:16]

    print(f"ready {os.getpid()}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "result":
            print(f"result {args.holds} {result()}", flush=True)
        elif command == "quit":
            break
    if args.holds == "nccl":
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

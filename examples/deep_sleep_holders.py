"""A PyTorch process holding what the driver's process checkpoint may not
take, for `vmmshim sleep` (docs/deep-sleep-design.md, "What the checkpoint cannot
take"), run under LD_PRELOAD=libvmmshim.so:
  --holds nccl      a one-rank NCCL process group after an all-reduce of a
                    1 GiB tensor (NCCL's own buffers and communicator)
  --holds exported  a 1 GiB tensor exported with cudaIpcGetMemHandle (what
                    torch.multiprocessing does to share it), whose handle no
                    other process needs to open for the export to exist
  --holds pair      two processes of one job: this one shares a 1 GiB tensor
                    with a child it starts (torch.multiprocessing, spawn),
                    which maps it (cudaIpcOpenMemHandle) and keeps it
Prints "ready PID" ("ready PID CHILD_PID" for a pair), then answers one
command per line on standard input:
  result  "result ..." (the all-reduce done again, or the tensor's digest;
          for a pair, the digest as each process reads it)
  quit    ends
so that a controller can sleep and wake it in between and compare.
"""
import argparse
import hashlib
import os
import sys


def digest(t):
    import torch
    torch.cuda.synchronize()
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()[:16]


def importer(requests, replies):
    """The pair's child: maps the parent's tensor and reads it on request."""
    shared = requests.get()  # cudaIpcOpenMemHandle of the parent's memory
    replies.put(os.getpid())
    for command in iter(requests.get, "quit"):
        replies.put(digest(shared))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--holds", choices=["nccl", "exported", "pair"], required=True)
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
    elif args.holds == "exported":
        x.untyped_storage()._share_cuda_()  # cudaIpcGetMemHandle of its memory
    torch.cuda.synchronize()
    ready = f"ready {os.getpid()}"
    if args.holds == "pair":
        import torch.multiprocessing as mp
        spawn = mp.get_context("spawn")
        requests, replies = spawn.Queue(), spawn.Queue()
        child = spawn.Process(target=importer, args=(requests, replies))
        child.start()
        requests.put(x)  # cudaIpcGetMemHandle here, cudaIpcOpenMemHandle in the child
        ready += f" {replies.get(timeout=180)}"

    def result():
        if args.holds == "nccl":
            import torch.distributed as dist
            dist.all_reduce(x)  # one rank: x as it was
        if args.holds == "pair":
            requests.put("digest")
            return f"{digest(x)} child {replies.get(timeout=60)}"
        return digest(x)

    print(ready, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "result":
            print(f"result {args.holds} {result()}", flush=True)
        elif command == "quit":
            break
    if args.holds == "nccl":
        import torch.distributed as dist
        dist.destroy_process_group()
    if args.holds == "pair":
        requests.put("quit")
        child.join(timeout=60)


if __name__ == "__main__":
    main()

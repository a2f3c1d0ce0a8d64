"""A PyTorch process to put to sleep from outside (tools/gpu/deep-sleep.sh):
weights (tag "weights") and a KV cache (tag "kv") on the GPU, then one command
per stdin line:
    result   prints a digest of a computation on the weights, and of the KV
             cache's contents, so that a run that slept can be compared with
             one that never did;
    refill   writes the KV cache again (after a sleep that dropped it);
    quit     ends.
Prints "ready PID" when the memory is made.
usage: deep_sleep_workload.py [--weights-gib N] [--kv-gib N]"""
import argparse
import hashlib
import os
import sys

import torch

try:
    import vmmshim
    tag = vmmshim.tag
except ImportError:  # natively, for the driver's checkpoint alone
    import contextlib
    tag = lambda _name: contextlib.nullcontext()  # noqa: E731


def digest(t):
    return hashlib.sha256(t.detach().cpu().numpy().tobytes()).hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights-gib", type=float, default=1)
    parser.add_argument("--kv-gib", type=float, default=16)
    args = parser.parse_args()
    g = torch.Generator(device="cuda").manual_seed(1234)
    n = int(args.weights_gib * (1 << 30)) // 4 // 4096
    with tag("weights"):
        weights = torch.randn(n, 4096, device="cuda", generator=g)
    kv_elems = int(args.kv_gib * (1 << 30)) // 2
    with tag("kv"):
        kv = torch.empty(kv_elems, dtype=torch.bfloat16, device="cuda")

    def refill():
        # In parts: one arange of the whole cache would overflow int32 and
        # need twice the cache in temporaries.
        part = 1 << 26
        for i in range(0, kv_elems, part):
            j = min(kv_elems, i + part)
            kv[i:j].copy_(torch.arange(i, j, device="cuda", dtype=torch.int64)
                          .remainder(977).to(torch.bfloat16))

    refill()
    x = torch.randn(4096, 64, device="cuda", generator=g)
    torch.cuda.synchronize()
    print("ready", os.getpid(), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "result":
            y = weights @ x
            print("result weights", digest(y.sum(0)), "kv", digest(kv[:: 1 << 20].float()),
                  flush=True)
        elif command == "refill":
            refill()
            torch.cuda.synchronize()
            print("refilled", flush=True)
        elif command == "quit":
            break


if __name__ == "__main__":
    main()

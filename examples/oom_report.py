"""Runs out of device memory on purpose, under the shim, to show its out-of-memory
report (docs/memory-snapshots.md): weights under the tag "weights", a KV cache under
"kv-cache", activations untagged, then one request larger than what is left. PyTorch
raises torch.OutOfMemoryError as without the shim; the shim's log names who holds the
memory, and with VMMSHIM_SNAPSHOT_FILE set writes FILE.oom.pickle at the failure.
    vmmshim run -- python3 examples/oom_report.py [--kv-gib 96]
"""
import argparse

import torch

import vmmshim


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights-gib", type=float, default=16)
    parser.add_argument("--kv-gib", type=float, default=96)
    args = parser.parse_args()
    gib = 1 << 30
    with vmmshim.tag("weights"):
        weights = [torch.empty(int(args.weights_gib * gib) // 8, dtype=torch.uint8, device="cuda")
                   for _ in range(8)]
    with vmmshim.tag("kv-cache"):
        kv = torch.empty(int(args.kv_gib * gib), dtype=torch.uint8, device="cuda")
    activations = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    free, total = torch.cuda.mem_get_info()
    request = free + 8 * gib  # more than is left
    print(f"free {free / gib:.1f} GiB of {total / gib:.1f} GiB; asking for {request / gib:.1f} GiB")
    try:
        torch.empty(request, dtype=torch.uint8, device="cuda")
        print("the allocation succeeded (nothing to report)")
        return 1
    except torch.OutOfMemoryError as e:
        print("torch.OutOfMemoryError:", str(e).splitlines()[0])
    del weights, kv, activations
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A program written for torch_memory_saver's API (preload mode), as RL
post-training frameworks use it between rollouts and training: model weights
in a region with a CPU backup, a KV cache in a region without one, a CUDA
graph captured with torch_memory_saver.cuda_graph (its pool backed up), then
cycles of work, pause of everything, a look at a weight's CPU backup while
paused, and resume. It imports only torch_memory_saver, so it runs unchanged
under torch_memory_saver itself (its preload library) and under vmmshim's
drop-in (`vmmshim run --torch-memory-saver -- python3 tms_sleep_wake.py`).

Prints one result line that depends only on the computation (identical in
every mode, and with --no-pause), whether the CPU backup held the weight,
and the pause and resume times of each cycle after the first (the first is
a warm-up: first-use costs of either tool).

usage: tms_sleep_wake.py [--kv-gib N] [--cycles N] [--no-pause]"""
import argparse
import hashlib
import time

import torch
from torch_memory_saver import torch_memory_saver


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kv-gib", type=float, default=8.0)
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--no-pause", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)

    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(),
                                    torch.nn.Linear(4096, 4096)).cuda()
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.empty(int(args.kv_gib * (1 << 30)) // 2, dtype=torch.float16, device="cuda")
    static_in = torch.zeros(64, 4096, device="cuda")
    inputs = [torch.randn(64, 4096, device="cuda") for _ in range(args.cycles)]

    # Warm-up on a side stream before the capture, as torch.cuda.graph asks.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch_memory_saver.cuda_graph(cuda_graph=graph, tag="graph",
                                                        enable_cpu_backup=True):
        static_out = model(static_in)

    weight_before = model[0].weight.detach().cpu()
    digest = hashlib.sha256()
    pauses, resumes, backup_ok = [], [], []
    for cycle in range(args.cycles):
        kv.fill_(cycle + 1)  # the cache is refilled after each wake, as an engine does
        static_in.copy_(inputs[cycle])
        graph.replay()
        digest.update(static_out.cpu().numpy().tobytes())
        digest.update(str(kv[:4096].float().sum().item()).encode())
        if args.no_pause:
            continue
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch_memory_saver.pause()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        backup = torch_memory_saver.get_cpu_backup(model[0].weight)
        backup_ok.append(backup is not None and torch.equal(backup, weight_before))
        torch_memory_saver.resume()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        pauses.append(t1 - t0)
        resumes.append(t2 - t1)
    with torch.no_grad():
        digest.update(model(inputs[0]).cpu().numpy().tobytes())

    print(f"tms_sleep_wake: result {digest.hexdigest()[:16]} after {args.cycles} cycles")
    if not args.no_pause:
        print(f"tms_sleep_wake: cpu backup of a weight while paused: "
              f"{'identical' if all(backup_ok) else 'WRONG'}")
        print("tms_sleep_wake: pause s " + " ".join(f"{t:.4f}" for t in pauses[1:]))
        print("tms_sleep_wake: resume s " + " ".join(f"{t:.4f}" for t in resumes[1:]))


if __name__ == "__main__":
    main()

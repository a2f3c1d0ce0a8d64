"""Paused memory stays addressable (docs/pause-resume.md, "Touching paused
memory"): a PyTorch program pauses everything with its contents (and a
scratch tensor without), then, while paused, launches kernels that read and
write paused tensors, replays a CUDA graph captured over them and takes an
optimizer step; then resumes. The same steps run again, never paused, from
the same seeds; every kept tensor must come out bit for bit the same.

Prints, one line each: the kernels' GiB/s on paused memory (host memory over
the bus) beside the same kernels on device memory, the pause and resume
times, and "paused-access: identical" or the tensors that differ (exit 1).
An access that faulted would end the process with CUDA's error.

    LD_PRELOAD=libvmmshim.so VMMSHIM_HOST_POOL_MAKE=pause python3 examples/paused_access.py [--gib 4]

VMMSHIM_PAUSED_ACCESS=host is the default; VMMSHIM_HOST_POOL_MAKE=pause makes
the host memory at the first pause, so that this program's one pause is
addressable at once. By default it is made in the background after a set's
first pause, and the contents move into it once it is there: with
--await-addressable SECONDS the program waits for that (residency()'s
paused_faulting_bytes at 0, printed with the wait) before it touches
anything, and fails if it does not come. Under VMMSHIM_PAUSED_ACCESS=fault
the first touch kills the context: that is the hazard host removes.
"""
import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

import vmmshim  # noqa: E402


def build(gib):
    """The program's state, from fixed seeds: a model, Adam with its states,
    a large buffer, a tensor a captured graph updates, and a scratch tensor
    whose contents nobody needs across the pause."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 2048)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 2048, device="cuda")
    model(x).square().mean().backward()  # Adam's states exist from the first step
    opt.step()
    opt.zero_grad(set_to_none=False)
    big = torch.empty(int(gib * (1 << 30)) // 4, device="cuda").uniform_()
    y = torch.randn(1 << 22, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y.mul_(1.0).add_(0.0)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        y.mul_(0.5).add_(1.0)
    with vmmshim.tag("scratch"):
        scratch = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    return model, opt, x, big, y, graph, scratch


def steps(model, opt, x, big, y, graph, scratch, timings):
    """What runs while paused (or, for the reference, without a pause)."""
    def timed(name, fn, nbytes):
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        timings[name] = nbytes / (1 << 30) / (time.perf_counter() - start)
        return result

    total = timed("read", lambda: big.sum(), big.nbytes)
    timed("write", lambda: big.mul_(0.75), 2 * big.nbytes)  # read and write
    scratch.fill_(7)  # dropped contents: undefined, but no fault
    graph.replay()
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    return float(total)


def digest(model, opt, big, y):
    h = {}
    tensors = {"big": big, "y": y}
    for i, p in enumerate(model.parameters()):
        tensors[f"param{i}"] = p.data
        for k, v in opt.state[p].items():
            if torch.is_tensor(v):
                tensors[f"param{i}.{k}"] = v
    for name, t in tensors.items():
        h[name] = hashlib.sha256(t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy()
                                 .tobytes()).hexdigest()
    return h


def faulting_bytes():
    """Paused bytes an access would fault on now (the shim's and other
    libraries' VMM memory, every device)."""
    total = 0
    for device in vmmshim.residency()["devices"]:
        total += sum(t["paused_faulting_bytes"] for t in device["shim"]["by_tag"].values())
        total += device["other_libraries_vmm"]["paused_faulting_bytes"]
    return total


def await_addressable(seconds):
    """Waits until no paused byte would fault; the seconds it took."""
    start = time.perf_counter()
    first = faulting_bytes()
    while faulting_bytes() > 0:
        if time.perf_counter() - start > seconds:
            sys.exit(f"paused-access: {faulting_bytes()} paused bytes still fault after "
                     f"{seconds:g} s (--await-addressable)")
        time.sleep(0.05)
    waited = time.perf_counter() - start
    print(f"paused-access: {first} paused bytes faulted right after the pause; all addressable "
          f"after {waited:.2f} s", flush=True)
    return waited


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=4)
    parser.add_argument("--await-addressable", type=float, metavar="SECONDS",
                        help="wait until no paused byte would fault before touching any "
                             "(the default VMMSHIM_HOST_POOL_MAKE=background's first pause)")
    args = parser.parse_args()
    if args.await_addressable is not None and not 0 <= args.await_addressable < float("inf"):
        parser.error("--await-addressable takes a number of seconds, 0 or more")
    if not vmmshim.loaded():
        sys.exit("paused-access: run it under the shim (LD_PRELOAD=libvmmshim.so)")
    torch.use_deterministic_algorithms(True)

    state = build(args.gib)
    device_timings = {}
    steps(*state, device_timings)
    reference = digest(state[0], state[1], state[3], state[4])
    del state
    torch.cuda.empty_cache()

    state = build(args.gib)
    start = time.perf_counter()
    # sole_submitter: nothing is held, so that autograd's own thread can run
    # the backward pass on paused memory (docs/pause-resume.md, "Quiescing").
    vmmshim.pause("scratch", keep_contents=False, sole_submitter=True)
    released = vmmshim.pause(sole_submitter=True)
    pause_s = time.perf_counter() - start
    if args.await_addressable is not None:
        await_addressable(args.await_addressable)
    paused_timings = {}
    steps(*state, paused_timings)
    start = time.perf_counter()
    restored = vmmshim.resume()
    resume_s = time.perf_counter() - start
    paused = digest(state[0], state[1], state[3], state[4])

    for name in ("read", "write"):
        print(f"paused-access: kernel {name} of {args.gib:g} GiB: {paused_timings[name]:.1f} GiB/s "
              f"on paused memory (host memory over the bus), {device_timings[name]:.1f} GiB/s on "
              f"device memory", flush=True)
    print(f"paused-access: pause {pause_s:.3f} s ({released} bytes), resume {resume_s:.3f} s "
          f"({restored} bytes)", flush=True)
    differ = sorted(name for name in reference if reference[name] != paused[name])
    if differ:
        print(f"paused-access: DIFFERS from the never-paused run: {', '.join(differ)}")
        return 1
    print(f"paused-access: identical ({len(reference)} tensors: the model, Adam's states, the "
          f"buffer written while paused, the graph's output)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

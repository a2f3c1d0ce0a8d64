"""A training step captured as a CUDA graph (torch.cuda.graph, whole-network
capture as in PyTorch's CUDA Graphs notes), replayed on fresh data, with a
checksum of the weights that must be identical with and without
LD_PRELOAD=libvmmshim.so.

During the capture PyTorch's allocator makes the memory of the graph's
private pool with cudaMalloc (with the thread's capture mode set to
relaxed), so allocations reach the shim while a global-mode capture is in
progress: the shim must serve them exactly where the driver would, and
leave the capture intact. With --capture-error-mode thread_local or relaxed
the capture is made in that mode instead.

    python3 examples/torch_graph.py [--replays N] [--capture-error-mode MODE]
"""
import argparse
import hashlib
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--capture-error-mode", default="global",
                        choices=["global", "thread_local", "relaxed"])
    args = parser.parse_args()
    torch.manual_seed(4321)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
        torch.nn.Linear(2048, 16)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    static_x = torch.randn(1024, 512, device=dev)
    static_y = torch.randint(0, 16, (1024,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(static_x), static_y)
        loss.backward()
        opt.step()
        return loss

    # Warm-up on a side stream, as the notes require before capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=args.capture_error_mode):
        static_loss = step()

    gen = torch.Generator(device=dev).manual_seed(99)
    for _ in range(args.replays):
        static_x.copy_(torch.randn(1024, 512, device=dev, generator=gen))
        static_y.copy_(torch.randint(0, 16, (1024,), device=dev, generator=gen))
        graph.replay()
    torch.cuda.synchronize()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    print(f"torch_graph: mode {args.capture_error_mode} replays {args.replays} "
          f"loss {static_loss.item():.6f} sha256 {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()

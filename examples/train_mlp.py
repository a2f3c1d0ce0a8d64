"""Trains a small MLP on synthetic data with a fixed seed and prints a
checksum of its weights. The checksum must be identical with and without
LD_PRELOAD=libvmmshim.so.

    python3 examples/train_mlp.py [--steps N]
"""
import argparse
import hashlib
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    x = torch.randn(8192, 256, device=dev)
    true_w = torch.randn(256, 10, device=dev)
    y = (x @ true_w).argmax(dim=1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (512,), device=dev)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)  # frees and re-allocates gradients
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    digest = hashlib.sha256()
    total = 0.0
    for p in model.parameters():
        t = p.detach().cpu().contiguous()
        digest.update(t.numpy().tobytes())
        total += float(t.double().sum())
    print(f"train_mlp: steps {args.steps} loss {loss.item():.6f} "
          f"weight-sum {total:.10f} sha256 {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()

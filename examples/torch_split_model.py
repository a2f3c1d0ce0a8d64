"""A model split across every GPU of the machine (a pipeline with one stage
per GPU) trained for a few steps, the activations moved from each GPU to the
next; prints a checksum of the weights, identical with and without
LD_PRELOAD=libvmmshim.so (policy all). On fewer than two GPUs it says so and
exits 0."""
import hashlib
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

gpus = torch.cuda.device_count()
if gpus < 2:
    print("torch_split_model: needs two GPUs")
    raise SystemExit(0)
torch.manual_seed(7)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
widths = [256] + [1024] * (gpus - 1) + [10]
stages = []
for i in range(gpus):
    layers = [torch.nn.Linear(widths[i], widths[i + 1])]
    if i < gpus - 1:
        layers.append(torch.nn.ReLU())
    stages.append(torch.nn.Sequential(*layers).to(f"cuda:{i}"))
params = [p for s in stages for p in s.parameters()]
opt = torch.optim.SGD(params, lr=0.05)
x = torch.randn(4096, 256, device="cuda:0")
y = torch.randint(0, 10, (4096,), device=f"cuda:{gpus - 1}")
for step in range(50):
    h = x
    for i, stage in enumerate(stages):
        h = stage(h.to(f"cuda:{i}"))  # device-to-device copy from the previous GPU
    loss = torch.nn.functional.cross_entropy(h, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
# Every GPU's tensor read by every other one.
moved = 0.0
for src in range(gpus):
    t = torch.arange(1 << 20, device=f"cuda:{src}", dtype=torch.float32)
    for dst in range(gpus):
        if dst != src:
            moved += t.to(f"cuda:{dst}").sum().item()
digest = hashlib.sha256()
for p in params:
    digest.update(p.detach().cpu().numpy().tobytes())
print(f"torch_split_model: {gpus} GPUs loss {loss.item():.6f} moved-sum {moved:.1f} "
      f"sha256 {digest.hexdigest()[:16]}")

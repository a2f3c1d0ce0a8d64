"""A model split across two GPUs (pipeline of two stages) trained for a few
steps with tensors moved between the devices; prints a checksum of the
weights, identical with and without LD_PRELOAD=libvmmshim.so (policy all).
On fewer than two GPUs it says so and exits 0."""
import hashlib
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

if torch.cuda.device_count() < 2:
    print("torch_two_gpu: needs two GPUs")
    raise SystemExit(0)
torch.manual_seed(7)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
a = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU()).to("cuda:0")
b = torch.nn.Sequential(torch.nn.Linear(1024, 10)).to("cuda:1")
opt = torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.05)
x = torch.randn(4096, 256, device="cuda:0")
y = torch.randint(0, 10, (4096,), device="cuda:1")
for step in range(50):
    h = a(x).to("cuda:1")  # device-to-device copy between the GPUs
    loss = torch.nn.functional.cross_entropy(b(h), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
moved = torch.arange(1 << 20, device="cuda:1", dtype=torch.float32).to("cuda:0").sum().item()
digest = hashlib.sha256()
for p in list(a.parameters()) + list(b.parameters()):
    digest.update(p.detach().cpu().numpy().tobytes())
print(f"torch_two_gpu: loss {loss.item():.6f} moved-sum {moved:.1f} sha256 {digest.hexdigest()[:16]}")

"""Times training steps of the examples/train_mlp.py model (median of 200 steps
after 20 warm-up steps, synchronized), for comparing native and shim runs."""
import statistics
import time

import torch

import tms_region

tms_region.enter_if_preloaded()  # no-op unless torch_memory_saver is preloaded

torch.manual_seed(0)
dev = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 10)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(2048, 1024, device=dev)
y = torch.randint(0, 10, (2048,), device=dev)
times = []
for step in range(220):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    if step >= 20:
        times.append((time.perf_counter() - t0) * 1e3)
print(f"torch_step_time: median {statistics.median(times):.3f} ms over {len(times)} steps")

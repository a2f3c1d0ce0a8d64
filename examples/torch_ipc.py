"""CUDA tensors sent between processes with torch.multiprocessing (CUDA IPC
underneath: cudaIpcGetMemHandle in the sender, cudaIpcOpenMemHandle in the
receiver). Run natively and under LD_PRELOAD=libvmmshim.so; the printed
results must be identical.

The parent sends two tensors (one large, one small, so both the shim's own
handles and packed granules are shared); the child checks them, computes on
them, writes its answer into the large one in place and sends a result back;
the parent checks the in-place change.
usage: python3 torch_ipc.py"""
import torch
import torch.multiprocessing as mp


def child(inbox, outbox):
    big, small = inbox.get()
    assert big.is_cuda and small.is_cuda
    s = float(big.double().sum().item())
    t = float(small.double().sum().item())
    big.mul_(2).add_(1)  # in place: the parent must see it
    torch.cuda.synchronize()
    outbox.put((s, t))
    inbox.get()  # keep the tensors alive until the parent has read them


def main():
    mp.set_start_method("spawn")
    torch.manual_seed(0)
    big = torch.arange(16 << 20, device="cuda", dtype=torch.float32).reshape(4096, -1) / 1000
    small = torch.linspace(0, 1, 100, device="cuda")
    inbox, outbox = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(inbox, outbox))
    p.start()
    inbox.put((big, small))
    s, t = outbox.get()
    after = float(big.double().sum().item())
    inbox.put("done")
    p.join()
    want_s = float(torch.arange(16 << 20, dtype=torch.float64).sum().item()) / 1000
    ok = (p.exitcode == 0 and abs(s - want_s) < 1e-3 * want_s and abs(t - 50.0) < 1e-3
          and abs(after - (2 * want_s + (16 << 20))) < 1e-3 * after)
    print(f"torch_ipc: child saw sums {s:.6e} and {t:.4f}; parent sees {after:.6e} after the "
          f"child's in-place update: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

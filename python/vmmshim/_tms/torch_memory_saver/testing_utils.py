"""torch_memory_saver.testing_utils (its examples import it): the device's
used memory, as torch_memory_saver's helper prints it."""
import torch

from vmmshim.torch_memory_saver import is_xpu

__all__ = ["is_xpu", "get_device", "empty_cache", "get_and_print_gpu_memory"]


def get_device() -> str:
    return "xpu" if is_xpu() else "cuda"


def empty_cache():
    torch.cuda.empty_cache()


def get_and_print_gpu_memory(message, gpu_id=0):
    """Prints and returns the device's used memory in bytes (the driver's
    view: total minus free, as nvidia-smi counts it)."""
    free, total = torch.cuda.mem_get_info(gpu_id)
    used = total - free
    print(f"GPU {gpu_id} memory: {used / 1024 ** 3:.2f} GB ({message})")
    return used

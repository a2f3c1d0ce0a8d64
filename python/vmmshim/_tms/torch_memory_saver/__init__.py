"""`import torch_memory_saver` served by vmmshim (vmmshim/torch_memory_saver.py
says what maps to what). This directory is put first on PYTHONPATH by
`vmmshim run --torch-memory-saver` and by configure_subprocess()."""
from vmmshim.torch_memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver

__all__ = ["TorchMemorySaver", "configure_subprocess", "torch_memory_saver"]

"""torch_memory_saver.entrypoint, as programs may import it."""
from vmmshim.torch_memory_saver import TorchMemorySaver

__all__ = ["TorchMemorySaver"]

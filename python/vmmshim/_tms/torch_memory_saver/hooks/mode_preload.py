"""torch_memory_saver.hooks.mode_preload.configure_subprocess, as programs
import it."""
from vmmshim.torch_memory_saver import configure_subprocess

__all__ = ["configure_subprocess"]

"""A whole process's deep sleep from the program (docs/deep-sleep.md):
vmmshim.sleep() and vmmshim.wake() run `vmmshim sleep` and `vmmshim wake` on
this process, since the driver's checkpoint calls are for an external
controller (cli/sleep_command.h says what each does and refuses)."""
import os
import subprocess

from vmmshim import _library


class SleepError(RuntimeError):
    """`vmmshim sleep` or `vmmshim wake` refused or failed; the message is its
    reason (nothing is left half asleep)."""


def _command():
    """The vmmshim command (vmmshim/_library.py, command_path)."""
    path = _library.command_path()
    if path is None:
        raise SleepError("vmmshim: no vmmshim command next to the package or the library")
    return path


def _run(*args):
    out = subprocess.run([_command(), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SleepError(out.stderr.strip() or f"vmmshim {args[0]} exited {out.returncode}")
    return out.stdout.strip()


def sleep(drop=None):
    """Gives this process's whole GPU back: everything the shim holds is paused
    (the tags of `drop` without their contents), then the driver checkpoints
    the rest, context included. Returns the line `vmmshim sleep` printed.
    After it, this process's CUDA calls block until a wake (another thread's
    vmmshim.wake(), or `vmmshim wake PID`); work without CUDA goes on.
    SleepError with the reason when refused (nothing paused) or failed
    (undone)."""
    args = ["sleep", str(os.getpid())]
    for tag in ([drop] if isinstance(drop, str) else (drop or [])):
        args += ["--drop", tag]
    return _run(*args)


def wake():
    """Restores and unlocks this process and resumes what the sleep paused;
    from a thread of the program while another is blocked in a CUDA call, or
    after the sleep returned. Returns the line `vmmshim wake` printed;
    SleepError with the reason otherwise."""
    return _run("wake", str(os.getpid()))

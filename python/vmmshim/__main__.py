"""`vmmshim ...` (the wheel's console command) and `python -m vmmshim ...`:
the wheel's bin/vmmshim (run, report, compare, trace; cli/vmmshim_cli.cc) in place
of this process, so that its exit status is the command's."""
import os
import sys

from vmmshim import _library


def main():
    binary = _library.command_path()
    if binary is None:
        sys.stderr.write(
            "vmmshim: no command in this package's bin/ nor next to a loaded libvmmshim.so: "
            "this copy of the Python package has no built library and command (install the "
            "wheel that tools/build/build-wheel.sh makes, or run build/vmmshim from a CMake "
            "build)\n")
        return 127
    os.execv(binary, [binary] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())

"""`vmmshim ...` (the wheel's console command) and `python -m vmmshim ...`:
the wheel's bin/vmmshim (run, report, compare, trace; cli/vmmshim_cli.cc) in place
of this process, so that its exit status is the command's."""
import os
import sys


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    binary = os.path.join(here, "bin", "vmmshim")
    if not os.access(binary, os.X_OK):
        sys.stderr.write(
            f"vmmshim: no command at {binary}: this copy of the Python package has no built "
            "library and command (install the wheel that tools/build/build-wheel.sh makes, or "
            "run build/vmmshim from a CMake build)\n")
        return 127
    os.execv(binary, [binary] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())

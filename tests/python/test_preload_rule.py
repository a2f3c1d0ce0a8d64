"""`vmmshim run` and Python's vmmshim.environment() put the shim first in
LD_PRELOAD by one rule (cli/run_options.h PreloadWith, python/vmmshim/
_library.py preload_with): the C++ side, seen through what `vmmshim run`
hands its program, equals the Python side for the same inputs. And the
options Python accepts are the ones `vmmshim options --json` prints.
Needs VMMSHIM_TEST_CLI (the vmmshim command) and VMMSHIM_TEST_SHIM
(libvmmshim.so)."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from vmmshim import _library  # noqa: E402

CLI = os.environ["VMMSHIM_TEST_CLI"]
SHIM = os.environ["VMMSHIM_TEST_SHIM"]


def run_preload(value):
    """LD_PRELOAD as `vmmshim run` hands it to its program, from `value`."""
    env = dict(os.environ)
    if value is None:
        env.pop("LD_PRELOAD", None)
    else:
        env["LD_PRELOAD"] = value
    out = subprocess.run([CLI, "run", "--lib", SHIM, "--", "/usr/bin/printenv", "LD_PRELOAD"],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


class PreloadRule(unittest.TestCase):
    def test_the_command_and_python_agree(self):
        link_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"preload-rule-{os.getpid()}")
        os.makedirs(link_dir, exist_ok=True)
        link = os.path.join(link_dir, "renamed.so")
        if not os.path.islink(link):
            os.symlink(SHIM, link)
        try:
            for value in [None, "", "/x/other.so", f"/x/other.so {SHIM}", f"{SHIM}:/x/a.so /x/b.so",
                          "/elsewhere/libvmmshim.so:/x/a.so", f"::{link}: /x/c.so  "]:
                with self.subTest(value=value):
                    self.assertEqual(run_preload(value),
                                     _library.preload_with(value or "", [SHIM]))
        finally:
            os.unlink(link)
            os.rmdir(link_dir)

    def test_python_takes_the_options_the_command_prints(self):
        printed = json.loads(subprocess.run([CLI, "options", "--json"], capture_output=True,
                                            text=True, check=True, timeout=60).stdout)
        self.assertEqual({o["keyword"]: o["variable"] for o in printed}, _library.run_options())
        flags = {o["flag"] for o in printed}
        self.assertIn("--policy", flags)
        # Each printed flag is one `vmmshim run` takes.
        helped = subprocess.run([CLI, "run", "--help"], capture_output=True, text=True,
                                timeout=60).stdout
        for flag in flags:
            self.assertIn(flag, helped)


if __name__ == "__main__":
    unittest.main()

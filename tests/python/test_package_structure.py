"""The Python package's structure (docs/architecture.md, "Python"): every
module of python/vmmshim imports in a fresh interpreter whichever comes
first, and no module reaches a private name of another (`from vmmshim.x
import _y`, or `mod._y` of an imported vmmshim module): the shared pieces
live in leaf modules with public names (_library.py: the C API; _tag_state:
the per-thread tag), so an import order or a rename cannot break a cycle."""
import ast
import os
import subprocess
import sys
import unittest

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
PACKAGE = os.path.join(PYTHON_DIR, "vmmshim")


def modules():
    """(dotted name, path) of every module of the package, _tms included."""
    out = []
    for root, _, files in os.walk(PACKAGE):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, PYTHON_DIR)[:-3].replace(os.sep, ".")
            out.append((rel[:-len(".__init__")] if rel.endswith(".__init__") else rel, path))
    return out


def importable(name):
    """The name `import` takes: the _tms drop-in is a top-level package
    (torch_memory_saver) put on the path by `vmmshim run --torch-memory-saver`."""
    return name.split("._tms.", 1)[1] if "._tms." in name else name


class PackageStructure(unittest.TestCase):
    def env(self):
        tms = os.path.join(PACKAGE, "_tms")
        return dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHON_DIR, tms]))

    def test_every_module_imports_first_and_in_any_order_tried(self):
        names = []
        for n, _ in modules():
            if n.endswith("__main__"):
                continue
            alone = subprocess.run([sys.executable, "-c", f"import {importable(n)}"],
                                   capture_output=True, text=True, env=self.env(), timeout=60)
            # A module for a framework's tests (torch_memory_saver.testing_utils
            # imports torch) is left out where the framework is not installed.
            if any(f"No module named '{fw}'" in alone.stderr for fw in ("torch", "cupy")):
                print(f"{n}: left out ({alone.stderr.strip().splitlines()[-1]})")
                continue
            names.append(importable(n))
        orders = [names, names[::-1]] + [[n] + [m for m in names if m != n] for n in names]
        for order in orders:
            r = subprocess.run([sys.executable, "-c", "; ".join(f"import {m}" for m in order)],
                               capture_output=True, text=True, env=self.env(), timeout=60)
            self.assertEqual(r.returncode, 0, f"import order {order}:\n{r.stderr[-2000:]}")

    def test_no_module_reaches_a_private_name_of_another(self):
        found = []
        for name, path in modules():
            tree = ast.parse(open(path).read(), path)
            aliases = set()  # local names bound to vmmshim modules
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and \
                        node.module.split(".")[0] in ("vmmshim", "torch_memory_saver"):
                    for a in node.names:
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            target = f"{node.module}.{a.name}"
                            if not os.path.exists(os.path.join(
                                    PYTHON_DIR, *target.split("."))) and not os.path.exists(
                                    os.path.join(PYTHON_DIR, *target.split(".")) + ".py"):
                                found.append(f"{path}:{node.lineno}: from {node.module} "
                                             f"import {a.name}")
                        aliases.add(a.asname or a.name)
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        if a.name.split(".")[0] == "vmmshim":
                            aliases.add(a.asname or a.name.split(".")[0])
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                        node.value.id in aliases and node.attr.startswith("_") and \
                        not node.attr.startswith("__"):
                    found.append(f"{path}:{node.lineno}: {node.value.id}.{node.attr}")
        self.assertEqual(found, [], "private names of other modules:\n" + "\n".join(found))


if __name__ == "__main__":
    unittest.main()

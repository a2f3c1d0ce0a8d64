#!/usr/bin/env python3
"""Checks that every include inside core/ follows the link graph of core/'s libraries.

Each folder of core/ is one static library (core/<folder>/CMakeLists.txt; the files in core/
itself are vmmshim_allocator); a library may include only headers of itself and of the
libraries it links, directly or through them. An include of a room above (the heap including
the facade, say) fails here, naming the file, the include and the libraries the folder may use.
usage: layering_check.py SOURCE_DIR
"""
import pathlib
import re
import sys


def libraries(core):
    """folder -> (library, [linked libraries]) from the CMakeLists.txt files of core/."""
    found = {}
    for cmake in sorted(core.rglob("CMakeLists.txt")):
        text = re.sub(r"#.*", "", cmake.read_text())
        folder = cmake.parent.relative_to(core).as_posix()
        folder = "" if folder == "." else folder
        for lib in re.findall(r"add_library\((\w+) STATIC", text):
            links = re.search(r"target_link_libraries\(%s\s+PUBLIC([^)]*)\)" % lib, text)
            deps = [d for d in (links.group(1).split() if links else []) if d.startswith("vmmshim_")]
            deps = [d for d in deps if d not in ("vmmshim_spdlog", "vmmshim_absl",
                                                 "vmmshim_cuda_headers")]
            found[folder] = (lib, [d for d in deps if d != "PRIVATE"])
    return found


def main():
    source = pathlib.Path(sys.argv[1])
    core = source / "core"
    libs = libraries(core)
    folder_of = {lib: folder for folder, (lib, _) in libs.items()}
    direct = {lib: deps for (lib, deps) in libs.values()}

    def closure(lib, seen=None):
        seen = set() if seen is None else seen
        for d in direct.get(lib, []):
            if d not in seen:
                seen.add(d)
                closure(d, seen)
        return seen

    errors = []
    for path in sorted(core.rglob("*")):
        if path.suffix not in (".h", ".cc", ".in"):
            continue
        folder = path.parent.relative_to(core).as_posix()
        folder = "" if folder == "." else folder
        if folder not in libs:
            errors.append(f"{path.relative_to(source)}: folder core/{folder} has no library")
            continue
        lib = libs[folder][0]
        allowed = {folder} | {folder_of[d] for d in closure(lib) if d in folder_of}
        for line in path.read_text().splitlines():
            m = re.match(r'#include "core/(?:([a-z_]+)/)?[a-z_]+\.h"', line)
            if not m:
                continue
            target = m.group(1) or ""
            if target not in allowed:
                errors.append(f"{path.relative_to(source)}: {line.strip()} crosses the layering: "
                              f"{lib} links {', '.join(sorted(closure(lib))) or 'nothing'}")
    for e in errors:
        print(e)
    if errors:
        return 1
    print(f"core/ layering: {len(libs)} libraries, every include follows their link graph")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks that every include inside core/ follows the link graph of core/'s libraries.

Each folder of core/ is one static library (core/<folder>/CMakeLists.txt; the files in core/
itself are vmmshim_allocator); a library may include only headers of itself and of the
libraries it links, directly or through them. An include of a room above (the heap including
the facade, say) fails here, naming the file, the include and the libraries the folder may use.

Calls that go the other way, from a lower room to a higher one, cannot show in the includes: a
lower room calls up through a function it was handed or an interface a higher room implements.
Each such path is listed below with its reason, and an unlisted one fails here:
- every std::function or absl::FunctionRef in core/ (a stored callback or a visitor), by file
  and name (ALLOWED_CALLBACKS);
- every class of core/ that implements an interface declared in another folder of core/ (the
  higher room registering with the lower one), by class and interface (ALLOWED_UPWARD_INTERFACES).
usage: layering_check.py SOURCE_DIR
"""
import pathlib
import re
import sys


ALLOWED_CALLBACKS = {
    ("core/base/socket_server.h", "Handler"):
        "a generic listener's per-connection function, as a thread's entry function: the "
        "control and IPC servers hand it their own member, it runs on the listener's thread",
    ("core/sync/context_sync.h", "SyncFn"):
        "downward: the driver call SyncCombiner combines across threads (SynchronizeContext); "
        "tests hand it a slow one",
    ("core/foreign/foreign_vmm.h", "fn"):
        "a visitor within the room (ForEachMappingOf), not stored",
    ("core/foreign/foreign_vmm_views.cc", "fn"):
        "the definition of the visitor above",
    ("core/heap/slab.h", "fn"):
        "a visitor within the room (Slab::ForEach), not stored",
    ("core/heap/slab.cc", "fn"):
        "the definition of the visitor above",
}

ALLOWED_UPWARD_INTERFACES = {
    ("StreamOrderedFrontEnd", "HeapTable::Listener"):
        "a device's stream-ordered cache is made with its heap",
    ("StreamOrderedFrontEnd", "PauseParticipant"):
        "freed stream-ordered blocks leave for their heap before a pause selects memory",
    ("ForeignVmm", "PausableMemory"):
        "other libraries' VMM memory pauses and resumes with the heaps, all or nothing",
}


def upward_paths(source, core, folder_of_file):
    """Callbacks and upward interfaces of core/ not in the lists above, as error lines."""
    errors = []
    declared = {}  # class name -> folder of its header
    texts = {}
    for path in sorted(core.rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        text = re.sub(r"//.*", "", path.read_text())
        texts[path] = text
        for m in re.finditer(r"^\s*class (\w+)\b[^;]*?\{", text, re.M):
            declared.setdefault(m.group(1), folder_of_file(path))
    seen_callbacks, seen_interfaces = set(), set()
    for path, text in texts.items():
        rel = path.relative_to(source).as_posix()
        for m in re.finditer(r"using (\w+) = std::function|"
                             r"(?:std::function|absl::FunctionRef)<[^;{]*?>\s*[&*]?\s*(\w+)", text):
            name = m.group(1) or m.group(2)
            seen_callbacks.add((rel, name))
            if (rel, name) not in ALLOWED_CALLBACKS:
                errors.append(f"{rel}: callback '{name}' is not in ALLOWED_CALLBACKS of "
                              f"tests/layering_check.py: a lower room calling up through it must "
                              f"be listed with its reason (or use an interface the lower room owns)")
        for m in re.finditer(r"^\s*class (\w+)(?: final)?\s*:\s*([^{]+)\{", text, re.M):
            for base in re.findall(r"(?:public|protected|private)\s+([\w:]+)", m.group(2)):
                outer = base.split("::")[0]
                if outer not in declared or declared[outer] == folder_of_file(path):
                    continue
                seen_interfaces.add((m.group(1), base))
                if (m.group(1), base) not in ALLOWED_UPWARD_INTERFACES:
                    errors.append(f"{rel}: {m.group(1)} implements {base} of core/"
                                  f"{declared[outer]}: an upward call, not in "
                                  f"ALLOWED_UPWARD_INTERFACES of tests/layering_check.py")
    # A listed path that no longer exists is a stale reason: the list says what is there.
    for key in sorted(set(ALLOWED_CALLBACKS) - seen_callbacks):
        errors.append(f"ALLOWED_CALLBACKS lists {key}, which core/ no longer has")
    for key in sorted(set(ALLOWED_UPWARD_INTERFACES) - seen_interfaces):
        errors.append(f"ALLOWED_UPWARD_INTERFACES lists {key}, which core/ no longer has")
    return errors


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
            m = re.match(r'#include "core/((?:[a-z_]+/)*)[a-z_]+\.h"', line)
            if not m:
                continue
            target = m.group(1).rstrip("/")
            if target not in allowed:
                errors.append(f"{path.relative_to(source)}: {line.strip()} crosses the layering: "
                              f"{lib} links {', '.join(sorted(closure(lib))) or 'nothing'}")
    def folder_of_file(path):
        folder = path.parent.relative_to(core).as_posix()
        return "" if folder == "." else folder

    errors += upward_paths(source, core, folder_of_file)
    for e in errors:
        print(e)
    if errors:
        return 1
    print(f"core/ layering: {len(libs)} libraries, every include follows their link graph; "
          f"{len(ALLOWED_CALLBACKS)} callbacks and {len(ALLOWED_UPWARD_INTERFACES)} upward "
          f"interfaces, each listed with its reason")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""vmmshim from Python: the C API of libvmmshim.so (include/vmmshim/vmmshim.h),
found in the running process with ctypes, as C programs find it with dlsym;
and, from the wheel (pip install vmmshim), the library itself and the
`vmmshim` command.

    vmmshim run -- python3 train.py          # or: python -m vmmshim run -- ...
    LD_PRELOAD=$(python -c 'import vmmshim; print(vmmshim.library_path())') python3 train.py

    import vmmshim
    with vmmshim.tag("kv"):             # allocations made here carry the tag
        kv = torch.empty(n, device="cuda")
    vmmshim.pause("kv")                 # physical memory released, contents kept
    ...
    vmmshim.resume("kv")                # same addresses, contents and peer access back

Where the shim is not loaded (or is disabled with VMMSHIM_ENABLE=0) the module
says so once (a RuntimeWarning naming the reason) and every call does nothing:
tag() is a plain context, pause/resume/release return 0, the queries None.
Other failures raise VmmshimError with the CUresult code of the C API.
Sizes are bytes. Thread safety: as the C API (any thread); tag() is per
thread, as vmmshim_set_allocation_tag is.
"""
import contextlib
import ctypes
import json
import os

from vmmshim import _library, _pools, _tag_state
from vmmshim._library import (KEEP_CONTENTS, SOLE_SUBMITTER, VmmshimError,  # noqa: F401
                              library_path, loaded)
from vmmshim._sleep import SleepError, sleep, wake  # noqa: F401

__all__ = ["VmmshimError", "loaded", "tag", "pause", "resume", "residency", "grant_peer_access",
           "revoke_peer_access", "query_peer_access", "release_cached_memory", "statistics",
           "paused_contents", "library_path", "environment", "configure_subprocess",
           "KEEP_CONTENTS", "record_memory_history", "snapshot", "sleep", "wake", "SleepError"]
__version__ = "0.1.0"



def environment(env=None, **options):
    """A copy of `env` (default os.environ) for a child process under the shim:
    libvmmshim.so first in LD_PRELOAD (once), and the options of `vmmshim run`
    as keywords, its flags without dashes ('-' as '_'): policy, min_bytes,
    config, stats, cache_limit, log_level, log_file, snapshot, as `vmmshim
    options` lists them (values as strings or ints; None leaves the variable
    as it is). For subprocess.run(cmd, env=vmmshim.environment(stats="/tmp/s.%p.json"))."""
    out = dict(os.environ if env is None else env)
    out["LD_PRELOAD"] = _library.preload_with(out.get("LD_PRELOAD", ""), [library_path()])
    known = _library.run_options() if options else {}
    for key, value in options.items():
        if key not in known:
            raise TypeError(f"vmmshim.environment: unknown option {key!r}; expected one of "
                            + ", ".join(sorted(known)))
        if value is not None:
            out[known[key]] = str(value)
    return out


@contextlib.contextmanager
def configure_subprocess(**options):
    """Inside, os.environ preloads the shim (environment(**options)), so that
    processes started there (subprocess, multiprocessing spawn, torchrun)
    run under it; restored at the end."""
    saved = dict(os.environ)
    new = environment(**options)
    os.environ.update(new)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)

def _check_tag(call, name, what="the tag"):
    """The tag rules of the C API, checked alike with and without the shim:
    a str (or None) of at most 255 bytes in UTF-8."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"vmmshim.{call}: {what} must be a str or None, not "
                        f"{type(name).__name__}")
    encoded = name.encode()
    if len(encoded) > 255:
        raise ValueError(f"vmmshim.{call}: {what} is {len(encoded)} bytes; at most 255")
    return encoded


def tag(name):
    """Allocations this thread makes inside carry allocation tag `name` (at most
    255 bytes; None: no tag); the tag that was set before is restored at the
    end. With PyTorch's caching allocator or CuPy's default pool, they also
    come from a pool of the tag's own, so that pausing the tag never pauses
    free space another allocation could be given (vmmshim/_pools.py).
    TypeError or ValueError at once for a tag the C API would refuse."""
    _check_tag("tag", name)
    return _tag(name)


@contextlib.contextmanager
def _tag(name):
    stack = _tag_state.tag_stack()
    _library.call("vmmshim_set_allocation_tag", name.encode() if name is not None else None)
    stack.append(name)
    routes = []
    try:
        if _library.handle() is not None:
            routes = _pools.enter_tag(name)
        yield
    finally:
        _pools.leave_tag(routes)
        stack.pop()
        previous = stack[-1] if stack else None
        _library.call("vmmshim_set_allocation_tag", previous.encode() if previous is not None else None)


def pause(tag=None, keep_contents=True, except_tags=None, sole_submitter=False):
    """Releases the physical memory of the allocations made under `tag` (None:
    all; stream-ordered ones too), keeping their addresses and, with
    keep_contents, their contents in host memory. `except_tags` (a list; not
    with `tag`): every allocation but those of these tags ("" the untagged).
    Returns the bytes released (0: nothing to pause, or paused already).
    Paused memory stays addressable (VMMSHIM_PAUSED_ACCESS=host, the
    default): a kernel that touches a tensor paused with its contents reads
    and writes those contents in pinned host memory, over the bus (slowly;
    the resume keeps the writes), so a tag paused with contents works as
    memory offloaded to the host; without contents it reads undefined data;
    neither faults (expandable_segments:True pages included). Kept contents
    are addressable at once from the next pause of the same set on; at the
    first, once their host memory, made in the background after it, is there
    and they have moved into it (within the host's memory and
    VMMSHIM_HOST_POOL_MAX; VMMSHIM_HOST_POOL_MAKE=pause: at once, made by
    the pause, slower). Until then, and for contents kept on disk, devices
    without host VMM memory and mappings of part of another library's
    handle, and under VMMSHIM_PAUSED_ACCESS=fault, an access faults:
    residency()'s `paused_faulting_bytes` say how many bytes would
    (docs/pause-resume.md, "Touching paused memory").
    Allocations made while paused, from any thread, get memory that is not
    paused: PyTorch's and CuPy's free blocks inside paused memory are not
    handed out before the resume (vmmshim/_pools.py).

    The program's GPU work is quiesced first: other threads' launches and
    copies wait, the work already submitted finishes. After a pause of
    everything (no tag, no except_tags) the other threads' GPU work waits
    until resume() of everything (the calling thread's own passes: a JAX
    program, whose computations run on JAX's own threads, would wait for
    ever; it synchronizes and passes sole_submitter=True); after a pause of
    tags it goes on at once. `sole_submitter=True`: the caller
    promises no other thread submits GPU work now (a training loop's own
    pause), and nothing is quiesced or held (docs/pause-resume.md,
    "Quiescing")."""
    n = ctypes.c_size_t(0)
    flags = (KEEP_CONTENTS if keep_contents else 0) | (SOLE_SUBMITTER if sole_submitter else 0)
    _check_tag("pause", tag)
    if except_tags is not None:
        if tag is not None:
            raise ValueError("vmmshim.pause: give tag or except_tags, not both")
        if isinstance(except_tags, str):
            except_tags = [except_tags]
        except_tags = list(except_tags)
        for t in except_tags:
            if t is None:
                raise TypeError("vmmshim.pause: except_tags holds str tags ('' the untagged)")
            _check_tag("pause", t, "each of except_tags")
        selected = _pools.Selection(keep=except_tags)
    else:
        selected = _pools.Selection(only=tag)
    if _library.api() is None:
        return 0
    undo = _pools.before_pause(selected)
    try:
        if except_tags is not None:
            keep = (ctypes.c_char_p * max(1, len(except_tags)))(*[t.encode() for t in except_tags])
            rc = _library.call("vmmshim_pause_memory_except", keep, len(except_tags), flags,
                       ctypes.byref(n))
        else:
            rc = _library.call("vmmshim_pause_memory", tag.encode() if tag is not None else None, flags,
                       ctypes.byref(n))
    except BaseException:
        _pools.pause_failed(undo)
        raise
    if rc is None:
        _pools.pause_failed(undo)
    else:
        _pools.after_pause(undo)
    return 0 if rc is None else n.value


def resume(tag=None):
    """Maps the paused memory of `tag` (None: all) again with its contents and
    peer access. Returns the bytes restored. When the device is short of
    memory, the frameworks' caches are given back (torch.cuda.empty_cache,
    which PyTorch applies to its default pool only while no route is open;
    every CuPy pool's free blocks) and the resume is tried once more."""
    n = ctypes.c_size_t(0)
    encoded = _check_tag("resume", tag)
    if _library.api() is None:
        return 0
    selected = _pools.Selection(only=tag)
    frameworks = _pools.before_resume(selected)
    ok = False
    try:
        try:
            rc = _library.call("vmmshim_resume_memory", encoded, ctypes.byref(n))
        except VmmshimError as e:
            # The work done while paused may have left its memory in the
            # framework's cache (an unpaused pool); given back, once more.
            if e.code != _library.OUT_OF_MEMORY or not _pools.release_cached(frameworks):
                raise
            rc = _library.call("vmmshim_resume_memory", encoded, ctypes.byref(n))
        ok = rc is not None
    finally:
        _pools.after_resume(frameworks, selected, ok)
    return 0 if rc is None else n.value


def grant_peer_access(obj, peer_device):
    """Lets `peer_device` access the allocation containing `obj`."""
    _library.call("vmmshim_grant_peer_access", _library.ptr(obj), peer_device)


def revoke_peer_access(obj, peer_device):
    """Takes `peer_device`'s access to it away, whatever the policy says."""
    _library.call("vmmshim_revoke_peer_access", _library.ptr(obj), peer_device)


def query_peer_access(obj, peer_device):
    """True or False: whether `peer_device` can access it (paused: after resume);
    None without the shim."""
    has = ctypes.c_int(0)
    rc = _library.call("vmmshim_query_peer_access", _library.ptr(obj), peer_device, ctypes.byref(has))
    return None if rc is None else bool(has.value)


def release_cached_memory(device=-1):
    """Gives the memory the shim keeps for reuse on `device` (-1: all) back to
    the driver. Returns the bytes released."""
    n = ctypes.c_size_t(0)
    rc = _library.call("vmmshim_release_cached_memory", device, ctypes.byref(n))
    return 0 if rc is None else n.value


def paused_contents(obj, nbytes, zero_copy=False):
    """The kept contents of a paused allocation: `nbytes` bytes from `obj`
    (an address, a tensor or a CUDA array) in the shim's host copy, as
    `bytes` (a copy taken now). None when the memory is not paused with its
    contents (or without the shim). VmmshimError for memory the shim does not
    serve or a range past the allocation's end.

    zero_copy=True: a read-only memoryview of the host copy itself instead,
    which nothing keeps alive: valid only until the memory is resumed or
    freed (after that it may show another allocation's paused contents, or
    be unmapped: reading it then kills the process), and with
    VMMSHIM_PAUSED_ACCESS=host it shows kernels' writes as they land."""
    address = _library.paused_address(obj, nbytes)
    if address is None:
        return None
    view = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B").toreadonly()
    return view if zero_copy else view.tobytes()


def _document(name):
    """A JSON document from one of the buffer-filling calls, as a dict; None
    without the shim."""
    needed = ctypes.c_size_t(0)
    if _library.call(name, None, 0, ctypes.byref(needed)) is None:
        return None
    for _ in range(3):  # the document may grow between the two calls
        buf = ctypes.create_string_buffer(needed.value + 4096)
        rc = getattr(_library.api(), name)(buf, len(buf), ctypes.byref(needed))
        if rc == 0:
            return json.loads(buf.value.decode())
        if rc != 1:
            raise VmmshimError(name, rc)
    raise VmmshimError(name, 1)


def statistics():
    """The shim's statistics as a dict (the VMMSHIM_STATS_FILE document: totals,
    devices, peers; units bytes and seconds), or None without the shim."""
    return _document("vmmshim_get_statistics")


def residency():
    """What the process holds on each device now, by category (a dict: per
    device, the device's used memory, the shim's memory by tag, resident and
    paused (and of the paused, `paused_faulting_bytes`: those an access
    would fault on now, since nothing is mapped there), its cache, other
    libraries' VMM memory (likewise), memory passed through to the driver, graph memory, the
    driver's default-pool part, and what is unattributed: the context and
    runtime; and the host memory pauses hold: the pinned pool and the host
    memory kept for addressable pauses, `host_memory_for_pauses`); bytes.
    None without the shim."""
    return _document("vmmshim_get_residency")


def record_memory_history(enabled=True, max_entries=0, stacks=0):
    """Starts (or with enabled=False stops) recording every allocation, free,
    mapping, pause, resume and peer decision of the shim's memory for
    snapshot(); `max_entries` events are kept (0: one million), `stacks`
    call-stack frames each (0 to 64; 0: only the caller library). As
    torch.cuda.memory._record_memory_history, for all of the process's
    device memory the shim serves. VMMSHIM_SNAPSHOT_FILE starts it at
    start-up. Nothing without the shim."""
    if _library.api() is None or not hasattr(_library.api(), "vmmshim_record_memory_history"):
        return None
    _library.call("vmmshim_record_memory_history", 1 if enabled else 0, max_entries, stacks)
    return None


def snapshot(path):
    """Writes a memory snapshot to `path` (a pickle in PyTorch's memory_viz
    format: python -m torch.cuda._memory_viz trace_plot PATH -o out.html, or
    pytorch.org/memory_viz; `vmmshim trace PATH` for Perfetto): every block
    the shim holds with its allocations, tags and caller libraries, and the
    recorded history. Returns the path, or None without the shim.
    VmmshimError (304) when the file cannot be written (the log says why)."""
    lib = _library.api()
    if lib is None or not hasattr(lib, "vmmshim_write_snapshot"):
        return None
    if _library.call("vmmshim_write_snapshot", os.fsencode(os.fspath(path))) is None:
        return None
    return os.fspath(path)


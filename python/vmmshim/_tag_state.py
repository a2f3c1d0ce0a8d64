"""The state vmmshim.tag keeps and the framework pools read: which tag each
thread allocates under, and the lock the pools' rules take. A leaf module
(it imports nothing of vmmshim), so that vmmshim/__init__.py, _pools.py and
the framework adaptors (_torch_pools.py, _cupy_pools.py) share it without
importing one another's private names (docs/architecture.md, "Python").

Thread safety: `lock` is reentrant; `thread` is per thread."""
import threading

lock = threading.RLock()  # the pools' rules (vmmshim/_pools.py)
thread = threading.local()  # .stack: this thread's vmmshim.tag names; the adaptors' own fields


def tag_stack():
    """This thread's stack of vmmshim.tag names (innermost last), made on
    first use."""
    stack = getattr(thread, "stack", None)
    if stack is None:
        stack = thread.stack = []
    return stack


def current_tag():
    """The innermost vmmshim.tag of this thread ("" untagged)."""
    stack = getattr(thread, "stack", None)
    return (stack[-1] or "") if stack else ""

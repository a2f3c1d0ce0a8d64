"""torch_memory_saver.entrypoint, as programs and torch_memory_saver's tests
import it: the drop-in module itself (one module, so that what a test
replaces on it, such as `is_xpu`, is what the regions call)."""
import sys

import vmmshim.torch_memory_saver as _drop_in

sys.modules[__name__] = _drop_in

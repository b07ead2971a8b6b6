"""Device work the job does with peakmem's dispatch mode turned off, recorded regardless.

The allocation recorder (capture/recorder.py) is a dispatch mode; the capture's torch-function
mode (capture/capture_modes.py) maps "cuda" to the meta device above it. A job that turns the
dispatch modes off around a device allocation (`torch.utils._python_dispatch.
_disable_current_modes()`, `_pop_mode_temporarily()`, `torch._C._DisableTorchDispatch()`) still
reaches the torch-function mode, so its tensor was made on the meta device, but no dispatch mode
saw the op: the allocation went unrecorded and the estimate came out low with exit 0.

The torch-function mode checks each call cheaply (the recorder on top of the dispatch stack and
the Python dispatch key not excluded: the usual state, three C calls), `recorder_missed` where
that fails; `recorder_restored` puts the recorder back
around that one call where the job took it away, and adds `NOTE` once. Peakmem's own code that turns the dispatch modes off on purpose while the
torch-function mode is on (flex_attention's graph tracing and operator handlers, eager mode's host
shadows) runs inside `peakmem_modes_off()`, where nothing is restored.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import _pop_mode, _push_mode

_PYTHON = torch._C.DispatchKey.Python
_SNAPSHOT = torch._C.DispatchKey.PythonTLSSnapshot
_stack_length = torch._C._len_torch_dispatch_stack
_stack_at = torch._C._get_dispatch_stack_at
_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded

NOTE = ("the job turned peakmem's dispatch mode off (torch.utils._python_dispatch."
        "_disable_current_modes, _pop_mode_temporarily or torch._C._DisableTorchDispatch) around "
        "device work: peakmem recorded that work regardless")

_INSIDE = threading.local()


@contextmanager
def peakmem_modes_off() -> Iterator[None]:
    """Peakmem's own code runs here with the dispatch modes off on purpose: not restored."""
    _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1
    try:
        yield
    finally:
        _INSIDE.depth -= 1


def recorder_missed(recorder: Any, session: Any) -> bool:
    """Whether an op called now would go unrecorded because the job turned the dispatch modes
    off: not inside peakmem's own regions, not after the capture, not where a mode of the job's
    own sits above the recorder."""
    if getattr(_INSIDE, "depth", 0) or session.closed:
        return False
    return (not any(_stack_at(i) is recorder for i in range(_stack_length()))
            or _excluded(_PYTHON))


@contextmanager
def recorder_restored(recorder: Any, session: Any) -> Iterator[None]:
    """The recorder back on the dispatch stack and the Python dispatch key back on for one call
    the job made with them off (`recorder_missed`), `NOTE` added once."""
    if NOTE not in session.notes:
        session.notes.append(NOTE)
    with ExitStack() as restored:
        if _excluded(_PYTHON):
            keys = torch._C._dispatch_tls_local_exclude_set().remove(_PYTHON).remove(_SNAPSHOT)
            restored.enter_context(torch._C._ForceDispatchKeyGuard(
                torch._C._dispatch_tls_local_include_set(), keys))
        if not any(_stack_at(i) is recorder for i in range(_stack_length())):
            _push_mode(recorder)
            restored.callback(_pop_mode)
        yield

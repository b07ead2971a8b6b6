"""The top-level modules this process had loaded once torch was imported, before peakmem's
capture modules: what a plain `python train.py` has loaded after its own `import torch`.

The job's child (capture/child.py) and the warm process (jobs/zygote.py) call `record()` before
they import the capture, so that the shadowing check (`capture.child.shadow_candidates`) refuses
a local `json.py` (which torch's import would load from the script's directory) but not a local
`profile.py` or `statistics.py`, which only peakmem's own modules load: a plain run never looks
for those unless the job imports them itself.
"""

from __future__ import annotations

import sys

_MODULES: frozenset[str] | None = None


def record() -> frozenset[str]:
    """Import torch (if it is not yet) and remember the top-level modules loaded at that point;
    later calls return the first answer (a fork of the warm process inherits it)."""
    global _MODULES
    if _MODULES is None:
        import torch  # noqa: F401 - what its import loads is the point

        _MODULES = frozenset(name for name in sys.modules if "." not in name)
    return _MODULES


def recorded() -> frozenset[str] | None:
    """The modules `record()` saw, or None where it was not called in this process."""
    return _MODULES

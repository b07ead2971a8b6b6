"""The capture running in this thread, found from torch's torch-function mode stack: for library
patches that run inside the job's calls (an optimizer's `apply`, a trainer's `fit`, a paged
optimizer's state) and have no session of their own."""

from __future__ import annotations

from typing import Any


def session_on_mode_stack() -> Any:
    """The running capture's session (the one the capture's torch-function mode holds), or None
    outside any capture."""
    from torch.overrides import _get_current_function_mode_stack

    from peakmem.capture.session import CaptureSession

    for mode in reversed(_get_current_function_mode_stack()):
        session = getattr(mode, "session", None)
        if isinstance(session, CaptureSession):
            return session
    return None

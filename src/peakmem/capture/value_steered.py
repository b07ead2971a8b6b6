"""Optimizers whose work is steered by values fake mode does not have.

`torch.optim.LBFGS.step` runs up to `max_iter` closure evaluations and keeps up to
`history_size` pairs of parameter-sized vectors, each decided on the host from the loss and
gradient values (`if ys > 1e-10`, `abs(loss - prev_loss) < tolerance_change`). Fake mode's
zeros would stop it after one evaluation with no history: a silent underestimate. In fake mode
the step is refused as a fake-mode limit instead (auto mode reruns the job in eager mode, where
the values are real).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.session import CaptureSession

LBFGS_REASON = (
    "torch.optim.LBFGS decides its iterations and its history from loss and gradient values, "
    "which fake mode does not have"
)


@contextmanager
def value_steered_optimizers(session: CaptureSession) -> Iterator[None]:
    """While inside, LBFGS steps in fake mode stop the job as a fake-mode limit."""
    lbfgs = torch.optim.LBFGS
    original = lbfgs.__dict__["step"]

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not session.eager:
            if session.fake_limit is None:
                session.fake_limit = LBFGS_REASON
            raise NotImplementedError(LBFGS_REASON)
        return original(self, *args, **kwargs)

    lbfgs.step = step
    try:
        yield
    finally:
        lbfgs.step = original

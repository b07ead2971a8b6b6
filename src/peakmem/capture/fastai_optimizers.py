"""fastai's own optimizers (`fastai.optimizer.Optimizer`: `Adam`, `SGD`, `RAdam`, `Lamb`, ...,
the Learner's default `opt_func`): their state is optimizer state.

fastai does not use torch.optim: `Optimizer.step` runs its stepper callbacks on each parameter
with a gradient and keeps what they return in `self.state[p]` (Adam's `grad_avg` and `sqr_avg`
tensors, a Python `step` count, `do_wd`). The capture recognises the in-place weight updates as
training steps (phases.py), but nothing marked the averages: they stayed `other`. After each
`step`, every tensor in the optimizer's `state` is re-tagged as optimizer state, as
`torch.optim.Optimizer.state` is after a step. Nothing happens before the job imports fastai.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import
from peakmem.capture.running_session import session_on_mode_stack
from peakmem.trace.vocab import Category

FASTAI_OPTIMIZER_MODULE = "fastai.optimizer"
_STATE_SOURCES = (Category.TEMPORARY.value, Category.OTHER.value, Category.INPUT.value,
                  Category.ACTIVATION.value, Category.MODEL_COPY.value)
"""What a state tensor may be tagged as when a stepper callback makes it (outside any
torch.optim step)."""


def classify_optimizer_state(session: Any, optimizer: Any) -> None:
    """Tag the tensors of a fastai optimizer's per-parameter `state` dicts as optimizer state."""
    for state in getattr(optimizer, "state", {}).values():
        if not isinstance(state, dict):
            continue
        for value in state.values():
            if isinstance(value, torch.Tensor):
                session.classify(value, Category.OPTIMIZER_STATE.value, only_from=_STATE_SOURCES)


def _patch_step(module: Any) -> Undo:
    base = getattr(module, "Optimizer", None)
    original = vars(base).get("step") if base is not None else None
    if original is None:
        return lambda: None

    def step(self: Any, closure: Any = None) -> Any:
        result = original(self, closure)
        session = session_on_mode_stack()
        if session is not None:
            classify_optimizer_state(session, self)
        return result

    base.step = step

    def undo() -> None:
        base.step = original

    return undo


@register_library_patch("fastai_optimizer_state")
@contextmanager
def fastai_optimizer_state() -> Iterator[None]:
    with patch_on_import(FASTAI_OPTIMIZER_MODULE, _patch_step):
        yield

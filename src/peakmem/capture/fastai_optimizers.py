"""fastai's own optimizers (`fastai.optimizer.Optimizer`: `Adam`, `SGD`, `RAdam`, `Lamb`, ...,
the Learner's default `opt_func`): their state is optimizer state.

fastai does not use torch.optim: `Optimizer.step` runs its stepper callbacks on each parameter
with a gradient and keeps what they return in `self.state[p]` (Adam's `grad_avg` and `sqr_avg`
tensors, a Python `step` count, `do_wd`). The capture recognises the in-place weight updates as
training steps (phases.py), but nothing marked the averages: they stayed `other`. After each
`step`, every tensor in the optimizer's `state` is re-tagged as optimizer state, as
`torch.optim.Optimizer.state` is after a step. Nothing happens before the job imports fastai.

Wrappers that subclass `Optimizer` with a `step` of their own keep per-parameter tensors outside
`state`: `Lookahead` (`ranger` is `Lookahead(RAdam(...))`) clones every parameter into
`slow_weights` at its first step and, every k-th step, moves them toward the weights and copies
them back. Those copies stayed `other`, then became `ema` at the first sync (weight_copies.py
reads a sync from a trained weight into a tensor no optimizer steps as an averaged model's).
The wrappers' steps are patched as the base's is, and the tensors under `WRAPPER_STATE_ATTRS`
are optimizer state too (timm's Lookahead keeps the same copies in `state`).
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


WRAPPER_STATE_ATTRS = ("slow_weights",)
"""Attributes of fastai optimizer wrappers holding per-parameter tensors outside `state`
(nested lists, fastcore `L`s): Lookahead's slow weights, one list per parameter group."""


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)) or type(value).__name__ == "L":
        for item in value:
            yield from _tensors(item)


def classify_optimizer_state(session: Any, optimizer: Any) -> None:
    """Tag the tensors of a fastai optimizer's per-parameter `state` dicts, and those its
    wrappers keep under `WRAPPER_STATE_ATTRS`, as optimizer state."""
    held = [state for state in vars(optimizer).get("state", {}).values()
            if isinstance(state, dict)]
    held += [vars(optimizer)[name] for name in WRAPPER_STATE_ATTRS if name in vars(optimizer)]
    for value in held:
        for tensor in _tensors(value):
            session.classify(tensor, Category.OPTIMIZER_STATE.value, only_from=_STATE_SOURCES)


def _classifying(original: Any) -> Any:
    def step(self: Any, closure: Any = None) -> Any:
        result = original(self, closure)
        session = session_on_mode_stack()
        if session is not None:
            classify_optimizer_state(session, self)
        return result

    return step


def _patch_step(module: Any) -> Undo:
    """`Optimizer.step` and the `step` of each `Optimizer` subclass the module defines with
    its own (`Lookahead`) classify what the optimizer holds after stepping."""
    base = getattr(module, "Optimizer", None)
    if base is None or "step" not in vars(base):
        return lambda: None
    classes = [base] + [cls for cls in vars(module).values()
                        if isinstance(cls, type) and issubclass(cls, base) and cls is not base
                        and "step" in vars(cls)]
    originals = {cls: vars(cls)["step"] for cls in classes}
    for cls, original in originals.items():
        cls.step = _classifying(original)

    def undo() -> None:
        for cls, original in originals.items():
            cls.step = original

    return undo


@register_library_patch("fastai_optimizer_state")
@contextmanager
def fastai_optimizer_state() -> Iterator[None]:
    with patch_on_import(FASTAI_OPTIMIZER_MODULE, _patch_step):
        yield

"""Keras 3 optimizers on the PyTorch backend (`KERAS_BACKEND=torch`): their state is optimizer
state.

Keras does not use torch.optim: `model.fit` calls `optimizer.apply(grads, trainable_variables)`
(keras/src/optimizers/base_optimizer.py), which builds the slot variables on its first call
(Adam's `m` and `v` per trainable variable, made with `add_variable_from_reference`, plus the
`iterations` counter) and updates the weights in place. The capture recognises those in-place
updates as training steps (phases.py), but nothing marked the slots: they were left in the
category of whatever was running when they were made. After each `apply`, every variable of the
optimizer (`optimizer.variables`: each holds a torch tensor on the device) is re-tagged as
optimizer state, as `torch.optim.Optimizer.state` is after a step. Nothing happens before the
job imports Keras.
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

KERAS_OPTIMIZER_MODULE = "keras.src.optimizers.base_optimizer"
_STATE_SOURCES = (Category.TEMPORARY.value, Category.OTHER.value, Category.INPUT.value,
                  Category.ACTIVATION.value, Category.MODEL_COPY.value)
"""What a slot variable may be tagged as when it is made inside `apply` (the step after a
backward, outside any torch.optim step)."""


def classify_optimizer_variables(session: Any, optimizer: Any) -> None:
    """Tag the tensors of `optimizer.variables` (Keras variables) as optimizer state."""
    for variable in getattr(optimizer, "variables", ()):
        value = getattr(variable, "_value", None)
        if isinstance(value, torch.Tensor):
            session.classify(value, Category.OPTIMIZER_STATE.value, only_from=_STATE_SOURCES)


def _patch_apply(module: Any) -> Undo:
    base = getattr(module, "BaseOptimizer", None)
    original = vars(base).get("apply") if base is not None else None
    if original is None:
        return lambda: None

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        result = original(self, grads, trainable_variables)
        session = session_on_mode_stack()
        if session is not None:
            classify_optimizer_variables(session, self)
        return result

    base.apply = apply

    def undo() -> None:
        base.apply = original

    return undo


@register_library_patch("keras_optimizer_state")
@contextmanager
def keras_optimizer_state() -> Iterator[None]:
    with patch_on_import(KERAS_OPTIMIZER_MODULE, _patch_apply):
        yield

"""Optimizers that make part of their state only every k-th step, allocated at the first step.

timm's `Lookahead` (`create_optimizer_v2(opt="lookahead_adamw")`, k = 6 by default) makes each
parameter's slow weights (`lookahead_slow_buff`, a copy of the parameter) at its first sync,
step k. A capture stops the training loop after a few steps (the DataLoader skips to its last
batch), so a job of one epoch never reached step k and its estimate lacked one copy of the
parameters that the real run holds from step k on. Here, after the wrapped optimizer's own step,
a group whose parameters have no slow weights yet is synced at once: the first sync copies the
parameters and leaves them as they were (slow = fast, then fast = slow), so it allocates what
step k would and changes no value the job computes with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import


@dataclass(frozen=True)
class PeriodicOptimizer:
    module: str
    cls: str
    slow_key: str
    """The per-parameter state entry the periodic sync makes."""
    sync: Callable[[Any, dict], None]
    """Runs the sync for one param group (allocating the missing entries)."""

    def lacks_state(self, optimizer: Any, group: dict) -> bool:
        state = _base(optimizer).state
        return any(p.grad is not None and self.slow_key not in state.get(p, {})
                   for p in group["params"])


def _base(optimizer: Any) -> Any:
    return getattr(optimizer, "_base_optimizer", None) or getattr(optimizer, "optimizer", optimizer)


PERIODIC_OPTIMIZERS: tuple[PeriodicOptimizer, ...] = (
    PeriodicOptimizer("timm.optim.lookahead", "Lookahead", "lookahead_slow_buff",
                      lambda optimizer, group: optimizer.update_slow(group)),
)


def _wrap_step(spec: PeriodicOptimizer) -> Callable[[Any], Undo]:
    def apply(module: Any) -> Undo:
        cls = getattr(module, spec.cls, None)
        if cls is None or "step" not in vars(cls):
            return lambda: None
        original = vars(cls)["step"]

        @wraps(original)
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            loss = original(self, *args, **kwargs)
            for group in _base(self).param_groups:
                if spec.lacks_state(self, group):
                    spec.sync(self, group)
            return loss

        cls.step = step

        def undo() -> None:
            cls.step = original

        return undo

    return apply


@register_library_patch("periodic_optimizer_state")
@contextmanager
def periodic_optimizer_state() -> Iterator[None]:
    """Each periodic optimizer's state made at its first step, once its module is imported."""
    with ExitStack() as stack:
        for spec in PERIODIC_OPTIMIZERS:
            stack.enter_context(patch_on_import(spec.module, _wrap_step(spec)))
        yield

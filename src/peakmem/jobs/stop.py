"""Stop a training script cleanly after N optimizer steps.

A global optimizer step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``)
counts every completed ``Optimizer.step`` of every optimizer; when the count reaches the limit it
raises :class:`StepLimitReached`, a ``BaseException`` so that a script's ``except Exception``
cannot swallow it. The runner catches it and reports a clean stop.

Usage::

    with stop_after_steps(3) as counter:
        ...  # run the script
    counter.steps  # optimizer steps completed

A step skipped by ``GradScaler`` (inf/nan gradients) never calls ``Optimizer.step`` and so is not
counted: the limit counts real parameter updates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

OnStep = Callable[[int], None]

ALL_STEPS = "all"
Steps = int | Literal["all"] | None
"""How long a job runs: N optimizer steps, "all" (to its end, nothing shortened) or None (the
capture's default: a few steps, its training loop ended early so what follows still runs)."""


def parse_steps(value: object) -> Steps:
    """`3`, `"3"`, `"all"` or None -> a step limit; ValueError for anything else (0, -1,
    "many", 2.5, True)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == ALL_STEPS:
            return ALL_STEPS
        if not text.isdigit():
            raise ValueError(f"steps must be an integer >= 1 or 'all', got {value!r}")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"steps must be an integer >= 1 or 'all', got {value!r}")
    if value < 1:
        raise ValueError(f"steps must be an integer >= 1 or 'all', got {value!r}")
    return value


class StepLimitReached(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Raised from the step hook once the limit is reached; caught by the job runner."""

    def __init__(self, steps: int) -> None:
        super().__init__(f"stopped after {steps} optimizer step(s)")
        self.steps = steps


@dataclass
class StepCounter:
    """Counts optimizer steps; ``limit=None`` counts without stopping."""

    limit: int | None
    steps: int = 0
    on_step: list[OnStep] = field(default_factory=list)

    @property
    def reached(self) -> bool:
        return self.limit is not None and self.steps >= self.limit

    def _hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        for callback in self.on_step:
            callback(self.steps)
        if self.reached:
            raise StepLimitReached(self.steps)


@contextmanager
def stop_after_steps(limit: int | None, on_step: OnStep | None = None) -> Iterator[StepCounter]:
    """Count optimizer steps inside the block and stop the job after ``limit`` of them.

    ``on_step(n)`` runs after each step, before the stop. The hook is removed on exit even when
    the block raises. ``StepLimitReached`` itself is not caught here: the runner decides.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"the step limit must be >= 1, got {limit}")
    from torch.optim.optimizer import register_optimizer_step_post_hook

    counter = StepCounter(limit=limit, on_step=[on_step] if on_step else [])
    handle = register_optimizer_step_post_hook(counter._hook)
    try:
        yield counter
    finally:
        handle.remove()


def is_step_limit(exc: BaseException | None) -> bool:
    """True when ``exc`` is the clean stop signal."""
    return isinstance(exc, StepLimitReached)

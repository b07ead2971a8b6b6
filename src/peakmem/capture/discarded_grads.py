"""Gradients thrown away: a `zero_grad` after a backward with no parameter update between.

A DataLoader epoch that ran a backward but has not fed two optimizer steps yet keeps yielding
full batches (capture.dataloader `_awaiting_steps`): the loop may accumulate gradients over a
window whose steps come later. A loop that clears the gradients of a backward before any
update used them is not accumulating: it computes gradients for something else (the input's,
as adversarial attacks, saliency maps and per-sample analyses do: pytorch/tutorials'
fgsm_tutorial.py calls `model.zero_grad()` before each image's backward and never steps).
Waiting there never ends (up to MAX_WAIT_BATCHES full batches an epoch, each traced), while
`len(loader)` already said the shortened length. Accumulation itself never does this: its
`zero_grad` comes after the window's step (or at the window's start, after the previous step).

While inside, `nn.Module.zero_grad` and `torch.optim.Optimizer.zero_grad` count, in
`CaptureState.grads_discarded`, the calls made when a backward ran since the previous such
call and no step (an optimizer's or a manual in-place update) was taken since.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.session import CaptureState


class DiscardWatch:
    """The backward passes and steps seen at the latest `zero_grad`."""

    def __init__(self, state: CaptureState) -> None:
        self.state = state
        self._mark = (0, 0)  # (steps of any kind, backward passes) at the latest zero_grad

    def zero_grad_called(self) -> None:
        state = self.state
        steps, backward = state.steps + state.manual_steps, state.backward_passes
        if steps == self._mark[0] and backward > self._mark[1]:
            state.grads_discarded += 1
        self._mark = (steps, backward)


@contextmanager
def watching_discarded_grads(state: CaptureState) -> Iterator[DiscardWatch]:
    """While inside, module and optimizer `zero_grad` calls go through a DiscardWatch."""
    watch = DiscardWatch(state)
    patched = []
    for owner in (torch.nn.Module, torch.optim.Optimizer):
        original = owner.__dict__["zero_grad"]

        def zero_grad(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            watch.zero_grad_called()
            return __original(self, *args, **kwargs)

        zero_grad.__wrapped__ = original  # type: ignore[attr-defined]
        owner.zero_grad = zero_grad  # type: ignore[method-assign]
        patched.append((owner, original))
    try:
        yield watch
    finally:
        for owner, original in patched:
            owner.zero_grad = original  # type: ignore[method-assign]

"""GradScaler's scale and growth tracker are bookkeeping between steps, not activations.

`torch.amp.GradScaler` (and `torch.cuda.amp.GradScaler`, its subclass) makes its loss scale and
growth tracker, two 0-d device tensors, on its first `scale(loss)` call: after the training
forward, before backward, so they were tagged like the forward's (`temporary`) and became
`activation` when backward started. They live as long as the scaler and are updated in place
by every step (`_amp_update_scale_`). They are the scaler's own state, kept outside
`optimizer.state` (which is what `optimizer_state` counts: capture.phases), so they are made
as between steps here (phase and category `other`, as a metric's state is): a block of the
forward phase tagged `other` would still become `activation` when backward starts. (The
per-step `found_inf` / `inv_scale` tensors of `unscale_` stay what their phase makes them.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.library_patches import patched, register_library_patch
from peakmem.trace.vocab import Phase

BETWEEN_STEPS = Phase.OTHER.value


@register_library_patch("grad_scaler_state")
@contextmanager
def grad_scaler_state() -> Iterator[None]:
    scaler_class = torch.amp.GradScaler
    original = scaler_class._lazy_init_scale_growth_tracker

    def lazy_init(self: Any, dev: Any) -> None:
        from peakmem.capture.running_session import session_on_mode_stack

        session = session_on_mode_stack()
        if session is None:
            original(self, dev)
            return
        state = session.state
        phase, state.phase = state.phase, BETWEEN_STEPS  # made as between steps: `other`
        try:
            original(self, dev)
        finally:
            state.phase = phase

    with patched(scaler_class, "_lazy_init_scale_growth_tracker", lazy_init):
        yield

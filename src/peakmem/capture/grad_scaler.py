"""GradScaler's scale and growth tracker are optimizer state in the breakdown.

`torch.amp.GradScaler` (and `torch.cuda.amp.GradScaler`, its subclass) makes its loss scale and
growth tracker, two 0-d device tensors, on its first `scale(loss)` call: after the training
forward, before backward, so they were tagged like the forward's (`temporary`) and became
`activation` when backward started. They live as long as the scaler and are updated in place
by every step (`_amp_update_scale_`): the state of the mixed-precision optimizer step, tagged
`optimizer_state` here. (The per-step `found_inf` / `inv_scale` tensors of `unscale_` stay what
their phase makes them.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.library_patches import patched, register_library_patch
from peakmem.trace.vocab import Category

STATE = Category.OPTIMIZER_STATE.value
_FROM = (Category.TEMPORARY.value, Category.OTHER.value, Category.ACTIVATION.value)


@register_library_patch("grad_scaler_state")
@contextmanager
def grad_scaler_state() -> Iterator[None]:
    scaler_class = torch.amp.GradScaler
    original = scaler_class._lazy_init_scale_growth_tracker

    def lazy_init(self: Any, dev: Any) -> None:
        original(self, dev)
        from peakmem.capture.running_session import session_on_mode_stack

        session = session_on_mode_stack()
        if session is None:
            return
        with torch._C.DisableTorchFunction():
            for tensor in (self._scale, self._growth_tracker):
                if isinstance(tensor, torch.Tensor):
                    session.classify(tensor, STATE, only_from=_FROM)

    with patched(scaler_class, "_lazy_init_scale_growth_tracker", lazy_init):
        yield

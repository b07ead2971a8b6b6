"""Frozen weights on the device are parameters in the breakdown, however they got there.

A Parameter with `requires_grad=False` (DiT's and MAE's sin-cos `pos_embed`, filled in place from
a numpy array; an EMA copy's weights) has no gradient and no optimizer state: no optimizer step
claims it, and a module that is never called (an EMA model, a VAE's unused decoder) runs no
forward hook that would. Its block was tagged by the op that made it: `input` (copied from the
host), `other` or `model_copy` (`copy.deepcopy` of a device model: a clone, capture.model_copies).
It is a model weight:
- moved to the device: `module_apply._claim_frozen_parameter`;
- frozen on the device (`p.requires_grad_(False)`, `p.requires_grad = False`: DiT's
  `requires_grad(ema, False)` after `ema = deepcopy(model)`) and
- deep-copied while frozen (`copy.deepcopy(model)` of a model on the device): here.
Only allocations tagged `input`, `other` or `model_copy` move (`FROZEN_FROM`); an EMA copy already tagged
`ema` stays one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.library_patches import patched, register_library_patch
from peakmem.capture.tensor_overrides import register_override
from peakmem.trace.vocab import Category

FROZEN_FROM = (Category.INPUT.value, Category.OTHER.value, Category.MODEL_COPY.value)


def claim_frozen(session: Any, tensor: Any) -> None:
    """`tensor`'s block holds a weight if it is a frozen Parameter on the fake device."""
    if (
        session is not None
        and isinstance(tensor, torch.nn.Parameter)
        and not tensor.requires_grad
        and tensor.device.type == "meta"
        and session.storage_kind(tensor) == "device"
    ):
        session.classify(tensor, Category.PARAMETER.value, only_from=FROZEN_FROM)


@register_override([torch.Tensor.requires_grad_])
def _requires_grad_(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    result = func(*args, **kwargs)
    claim_frozen(mode.session, args[0])
    return result


@register_override([torch.Tensor.requires_grad.__set__])
def _set_requires_grad(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    result = func(*args, **kwargs)
    claim_frozen(mode.session, args[0])
    return result


@register_library_patch("frozen_parameter_deepcopy")
@contextmanager
def frozen_parameter_deepcopy() -> Iterator[None]:
    """`copy.deepcopy` of a frozen device Parameter: the copy is a weight too."""
    original = torch.nn.Parameter.__deepcopy__

    def deepcopy(self: Any, memo: dict) -> Any:
        result = original(self, memo)
        from peakmem.capture.running_session import session_on_mode_stack

        with torch._C.DisableTorchFunction():
            claim_frozen(session_on_mode_stack(), result)
        return result

    with patched(torch.nn.Parameter, "__deepcopy__", deepcopy):
        yield

"""DeepSpeed ZeRO's flat partition buffers labelled as what they hold.

ZeRO-3 keeps each rank's part of the model in flat buffers that no module owns: the 16-bit
parameter partitions (`lp_param_buffer`, viewed as `fp16_partitioned_groups_flat` and each
parameter's `ds_tensor`; the module's own parameters are empty between gathers) and the
gradient partitions (`grad_partitions_flat_buffer`). Made by a host-to-device copy or a factory
outside any forward, they were tagged `input` / `other`. Before each step of a ZeRO optimizer
they are re-tagged: the 16-bit partitions `parameter`, the gradient partitions `gradient`. The
fp32 master partition is the parameter the inner optimizer steps (tagged `parameter` by the
phase tracker) and Adam's moments its `optimizer_state`, as for any optimizer.

Only allocations still tagged input / temporary / other move: nothing the tracker classified
is overridden. Host buffers (`offload_param`, `offload_optimizer`) are not device memory and
are left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import
from peakmem.trace.vocab import Category

UNCLASSIFIED = (Category.INPUT.value, Category.TEMPORARY.value, Category.OTHER.value)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


def _stage3_buffers(optimizer: Any) -> Iterator[tuple[torch.Tensor, str]]:
    parameter, gradient = Category.PARAMETER.value, Category.GRADIENT.value
    for name in ("lp_param_buffer", "fp16_partitioned_groups_flat"):
        for tensor in _tensors(getattr(optimizer, name, None)):
            yield tensor, parameter
    for group in getattr(optimizer, "fp16_groups", None) or []:
        for param in group:
            ds_tensor = getattr(param, "ds_tensor", None)
            if isinstance(ds_tensor, torch.Tensor):
                yield ds_tensor, parameter
    for tensor in _tensors(getattr(optimizer, "grad_partitions_flat_buffer", None)):
        yield tensor, gradient


def _stage12_buffers(optimizer: Any) -> Iterator[tuple[torch.Tensor, str]]:
    """ZeRO-1/2: the flat 16-bit groups (the model's parameters are views of them)."""
    for tensor in _tensors(getattr(optimizer, "bit16_groups_flat", None)):
        yield tensor, Category.PARAMETER.value


ZERO_OPTIMIZERS: dict[tuple[str, str], Callable[[Any], Iterator[tuple[torch.Tensor, str]]]] = {
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3"): _stage3_buffers,
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer"): _stage12_buffers,
}
"""(module, class) of a ZeRO optimizer -> its flat buffers and what each holds."""


def classify_partitions(optimizer: Any, buffers: Callable[[Any], Iterator[tuple[torch.Tensor, str]]]
                        ) -> None:
    from peakmem.capture.bitsandbytes_model import current_session

    session = current_session()
    if session is None or session.closed:
        return
    for tensor, category in buffers(optimizer):
        session.classify(tensor, category, only_from=UNCLASSIFIED)


def _wrap_step(class_name: str, buffers: Callable[[Any], Iterator[tuple[torch.Tensor, str]]]
               ) -> Callable[[Any], Undo]:
    def apply(module: Any) -> Undo:
        cls = getattr(module, class_name, None)
        original = getattr(cls, "step", None) if cls is not None else None
        if original is None:
            return lambda: None

        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            classify_partitions(self, buffers)
            return original(self, *args, **kwargs)

        cls.step = step

        def undo() -> None:
            cls.step = original

        return undo

    return apply


@register_library_patch("deepspeed_zero_partitions")
@contextmanager
def deepspeed_zero_partitions() -> Iterator[None]:
    with ExitStack() as stack:
        for (module, class_name), buffers in ZERO_OPTIMIZERS.items():
            stack.enter_context(patch_on_import(module, _wrap_step(class_name, buffers)))
        yield

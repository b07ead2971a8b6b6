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

The whole `step` of these optimizers (and of DeepSpeed's bf16 / fp16 wrappers, which keep no
flat buffers of their own to re-tag) runs in the optimizer phase, as a torch optimizer's does:
the gradient norms, overflow checks, the fp32 copies of the gradient partitions and the
16-bit copies of the updated master weights it makes around the inner optimizer's step are
optimizer-step `temporary` allocations, not `other` (`PhaseTracker.outer_step`). Likewise the
engine's backward epilogue (`DeepSpeedEngine._backward_epilogue`: the gradient reduction after
autograd's backward returned, or from a hook inside it) runs in the backward phase: its
buckets and flat gradient buffers are backward `temporary` until a step re-tags what stays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

import torch

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import
from peakmem.trace.vocab import Category

UNCLASSIFIED = (Category.INPUT.value, Category.TEMPORARY.value, Category.OTHER.value,
                Category.MODEL_COPY.value)


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
    """ZeRO-1/2: the flat 16-bit groups (the model's parameters are views of them) and, with
    `contiguous_gradients`, the flat 16-bit gradients of the rank's partition
    (`grads_in_partition`, made after the first backward)."""
    for tensor in _tensors(getattr(optimizer, "bit16_groups_flat", None)):
        yield tensor, Category.PARAMETER.value
    for tensor in _tensors(getattr(optimizer, "grads_in_partition", None)):
        yield tensor, Category.GRADIENT.value


def _no_buffers(optimizer: Any) -> Iterator[tuple[torch.Tensor, str]]:
    """A wrapper whose 16-bit weights are the model's own parameters."""
    return iter(())


ZERO_OPTIMIZERS: dict[tuple[str, str], Callable[[Any], Iterator[tuple[torch.Tensor, str]]]] = {
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3"): _stage3_buffers,
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer"): _stage12_buffers,
    ("deepspeed.runtime.bf16_optimizer", "BF16_Optimizer"): _no_buffers,
    ("deepspeed.runtime.fp16.fused_optimizer", "FP16_Optimizer"): _no_buffers,
    ("deepspeed.runtime.fp16.unfused_optimizer", "FP16_UnfusedOptimizer"): _no_buffers,
}
"""(module, class) of a DeepSpeed optimizer wrapping a torch optimizer -> its flat buffers and
what each holds."""


def classify_partitions(optimizer: Any, buffers: Callable[[Any], Iterator[tuple[torch.Tensor, str]]]
                        ) -> None:
    session = _session()
    if session is None:
        return
    for tensor, category in buffers(optimizer):
        session.classify(tensor, category, only_from=UNCLASSIFIED)


def _session() -> Any:
    from peakmem.capture.running_session import session_on_mode_stack as current_session

    session = current_session()
    return None if session is None or session.closed else session


def _backward_phase() -> AbstractContextManager:
    """The backward phase for the engine's backward epilogue (nothing outside a capture)."""
    session = _session()
    tracker = getattr(session, "phase_tracker", None)
    return nullcontext() if tracker is None else tracker.outer_backward()


def _wrap_backward_epilogue(module: Any) -> Undo:
    cls = getattr(module, "DeepSpeedEngine", None)
    original = getattr(cls, "_backward_epilogue", None) if cls is not None else None
    if original is None:
        return lambda: None

    def _backward_epilogue(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _backward_phase():
            return original(self, *args, **kwargs)

    cls._backward_epilogue = _backward_epilogue

    def undo() -> None:
        cls._backward_epilogue = original

    return undo


def _step_phase() -> AbstractContextManager:
    """The optimizer phase for the wrapper's whole step (nothing outside a capture)."""
    session = _session()
    tracker = getattr(session, "phase_tracker", None)
    return nullcontext() if tracker is None else tracker.outer_step()


def _wrap_step(class_name: str, buffers: Callable[[Any], Iterator[tuple[torch.Tensor, str]]]
               ) -> Callable[[Any], Undo]:
    def apply(module: Any) -> Undo:
        cls = getattr(module, class_name, None)
        original = getattr(cls, "step", None) if cls is not None else None
        if original is None:
            return lambda: None

        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            classify_partitions(self, buffers)
            with _step_phase():
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
        stack.enter_context(patch_on_import("deepspeed.runtime.engine", _wrap_backward_epilogue))
        yield

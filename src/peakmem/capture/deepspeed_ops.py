"""DeepSpeed's CUDA extension ops on the fake device: the fused optimizers' kernels.

DeepSpeed's optimizers load their CUDA kernels through an op builder (`FusedAdamBuilder().load()`):
the op prebuilt into the wheel, or else compiled on the spot with nvcc (JIT: it needs CUDA_HOME
and a GPU toolchain). A config's `"optimizer": {"type": "Adam"}` picks `FusedAdam` on CUDA, so a
capture stopped at "CUDA_HOME environment variable is not set" before the first step.

The multi-tensor update kernels work in place on the lists they are given (parameters, gradients,
moments, all made beforehand by the optimizer's Python) and allocate nothing on the device, so
here the builders of those ops load a stand-in that updates in place with no temporary (FusedAdam's
update itself, so eager host values stay right; FusedLion's does nothing). Other builders load as
before (a job that needs one gets DeepSpeed's own error).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from typing import Any

import torch

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import

BUILDER_MODULES = ("deepspeed.ops.op_builder.builder", "op_builder.builder")
"""Where OpBuilder lives: DeepSpeed's package, or the top-level `op_builder` of a source install."""


def _in_place_update(*args: Any, **kwargs: Any) -> None:
    """`multi_tensor_*(chunk_size, noop_flag, tensor_lists, *hyperparameters)`: the CUDA kernel
    writes the tensors of `tensor_lists` in place."""
    return None


def multi_tensor_adam(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                      lr: float, beta1: float, beta2: float, eps: float, step: int, adam_w_mode: int,
                      bias_correction: int, weight_decay: float) -> None:
    """csrc/adam/multi_tensor_adam.cu: one Adam(W) step over [grads, params, exp_avgs,
    exp_avg_sqs], in place (the denominator is formed in exp_avg_sq and undone: no temporary)."""
    correction1 = 1 - beta1**step if bias_correction else 1.0
    correction2 = 1 - beta2**step if bias_correction else 1.0
    step_size = lr / correction1
    with torch.no_grad():
        for grad, param, exp_avg, exp_avg_sq in zip(*tensor_lists, strict=True):
            if weight_decay and not adam_w_mode:
                grad = grad.add(param, alpha=weight_decay)  # L2 mode: the kernel adds it per element
            exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            if weight_decay and adam_w_mode:
                param.mul_(1 - lr * weight_decay)
            exp_avg_sq.sqrt_().div_(math.sqrt(correction2)).add_(eps)
            param.addcdiv_(exp_avg, exp_avg_sq, value=-step_size)
            exp_avg_sq.sub_(eps).mul_(math.sqrt(correction2)).square_()


IN_PLACE_OPS: dict[str, dict[str, Callable[..., None]]] = {
    "fused_adam": {"multi_tensor_adam": multi_tensor_adam},  # FusedAdam: the update itself, in place
    "fused_lion": {"multi_tensor_lion": _in_place_update},  # FusedLion
}
"""Op builder name -> the functions of its stand-in module."""


def _stand_in_loads(module: Any) -> Undo:
    builder = module.OpBuilder
    original = builder.load

    def load(self: Any, verbose: bool = False) -> Any:
        functions = IN_PLACE_OPS.get(getattr(self, "name", None) or "")
        if functions is None:
            return original(self, verbose)
        return SimpleNamespace(__name__=f"peakmem stand-in for {self.name}", **functions)

    builder.load = load

    def undo() -> None:
        builder.load = original

    return undo


@register_library_patch("deepspeed_fused_optimizer_ops")
@contextmanager
def deepspeed_fused_optimizer_ops() -> Iterator[None]:
    with ExitStack() as stack:
        for name in BUILDER_MODULES:
            stack.enter_context(patch_on_import(name, _stand_in_loads))
        yield

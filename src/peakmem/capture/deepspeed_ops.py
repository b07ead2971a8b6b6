"""DeepSpeed's CUDA ops that it compiles on first use (JIT, with nvcc and CUDA_HOME): the capture
has neither, so `OpBuilder.jit_load` of one failed (`CUDA_HOME environment variable is not set`)
and any job whose DeepSpeed config names an optimizer (`"optimizer": {"type": "AdamW"}`:
DeepSpeed's FusedAdam, the Trainer's `--deepspeed ds_config.json`) could not be estimated.

Here the ops a stand-in is registered for load as that stand-in: it updates its tensors in place
and allocates nothing, as the CUDA kernel does (its tensor lists are the optimizer's state, made
by the optimizer in Python). Every other op builds as before (and fails as before, when it must).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import patch_on_import

BUILDER_MODULE = "deepspeed.ops.op_builder.builder"


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


STAND_INS: dict[str, Callable[[], Any]] = {
    "fused_adam": lambda: SimpleNamespace(multi_tensor_adam=multi_tensor_adam),
}
"""DeepSpeed op name (its builder's NAME) -> the module it loads as here."""


def _stand_in_jit_load(builder_module: Any) -> Callable[[], None]:
    op_builder = builder_module.OpBuilder
    original = op_builder.__dict__["jit_load"]

    def jit_load(self: Any, verbose: bool = True) -> Any:
        make = STAND_INS.get(getattr(self, "name", None))
        if make is None:
            return original(self, verbose)
        module = make()
        op_builder._loaded_ops[self.name] = module
        return module

    op_builder.jit_load = jit_load

    def undo() -> None:
        op_builder.jit_load = original
        for name in STAND_INS:
            op_builder._loaded_ops.pop(name, None)

    return undo


@register_library_patch("deepspeed_jit_ops")
@contextmanager
def deepspeed_jit_ops() -> Iterator[None]:
    """DeepSpeed's JIT-built ops with a stand-in load as it (see the module docstring)."""
    with patch_on_import(BUILDER_MODULE, _stand_in_jit_load):
        yield

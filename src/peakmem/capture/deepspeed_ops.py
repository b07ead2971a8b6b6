"""DeepSpeed's CUDA extension ops on the fake device: the fused optimizers' kernels.

DeepSpeed's optimizers load their CUDA kernels through an op builder (`FusedAdamBuilder().load()`):
the op prebuilt into the wheel, or else compiled on the spot with nvcc (JIT: it needs CUDA_HOME
and a GPU toolchain). A config's `"optimizer": {"type": "Adam"}` picks `FusedAdam` on CUDA, so a
capture stopped at "CUDA_HOME environment variable is not set" before the first step.

The multi-tensor update kernels work in place on the lists they are given (parameters, gradients,
moments, all made beforehand by the optimizer's Python) and allocate nothing on the device, so
here the builders of those ops load a stand-in that updates in place with no temporary (FusedAdam's
update itself, so eager host values stay right; FusedLion's does nothing). FusedLamb's kernel
(csrc/lamb/fused_lamb_cuda.cpp) allocates per tensor and step two 512-element reduction buffers,
freed on return, and the one-element trust ratio it returns (FusedLamb keeps the step's ratios):
its stand-in allocates those three on the parameter's device as the kernel does.

ZeRO-Offload (`"offload_optimizer": {"device": "cpu"}`) steps DeepSpeedCPUAdam / CPUAdagrad /
CPULion: C++ ops (`cpu_adam`, `cpu_adagrad`, `cpu_lion`) JIT-built with the host compiler (minutes,
or an error where there is none) that update the host fp32 master partition in place. Their
stand-ins do the same update on those host tensors (host memory, nothing on the device). Other
builders load as before (a job that needs one gets DeepSpeed's own error).

`deepspeed.zero.Init()` (a model built partitioned, ZeRO-3) replaces `torch.Tensor.__new__` and the
factory functions while the model is built. The capture's torch-function modes call functions that
torch wraps with `torch._disable_dynamo`, whose first call imports `torch._dynamo`; imported then,
dynamo's polyfill of `Tensor.__new__` checks the signature of DeepSpeed's replacement and raises
("Signature mismatch between ... new_tensor and ... tensor_pynew"). A job on a GPU never imports
dynamo there, so here dynamo is imported before `zero.Init` installs its wrappers.
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


def _no_op(*args: Any, **kwargs: Any) -> int:
    """A stand-in that allocates and changes nothing: FusedLion's
    `multi_tensor_lion(chunk_size, noop_flag, tensor_lists, *hyperparameters)` (the CUDA kernel
    writes `tensor_lists` in place) and the CPU optimizers' `create_*` / `destroy_*` (0: done)."""
    return 0


def _apply_update(param: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  value: float, correction2: float, eps: float) -> None:
    """param += value * exp_avg / (sqrt(exp_avg_sq / correction2) + eps), in place: the
    denominator is formed in exp_avg_sq and undone afterwards, so no temporary is allocated."""
    exp_avg_sq.sqrt_().div_(math.sqrt(correction2)).add_(eps)
    param.addcdiv_(exp_avg, exp_avg_sq, value=value)
    exp_avg_sq.sub_(eps).mul_(math.sqrt(correction2)).square_()


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
            _apply_update(param, exp_avg, exp_avg_sq, -step_size, correction2, eps)


def lamb(param: torch.Tensor, param_copy: torch.Tensor, exp_avg: torch.Tensor,
         exp_avg_sq: torch.Tensor, grad: torch.Tensor, lr: float, beta1: float, beta2: float,
         max_coeff: float, min_coeff: float, eps: float, grad_scale: float, step: int, eps_mode: int,
         bias_correction: int, decay: float) -> torch.Tensor:
    """csrc/lamb/fused_lamb_cuda.cpp `lamb`: the kernel's buffers (two 512-element reductions,
    freed on return; the returned one-element trust ratio) and its in-place update of the moments,
    the parameter (and the low-precision copy), with the trust ratio taken as 1 (its value only)."""
    reduce_dtype = torch.float32 if param.dtype == torch.float16 else param.dtype
    weight_norms = torch.empty(512, dtype=reduce_dtype, device=param.device)
    update_norms = torch.empty(512, dtype=reduce_dtype, device=param.device)
    trust_ratio = torch.empty(1, dtype=reduce_dtype, device=param.device)
    correction1 = 1 - beta1**step if bias_correction else 1.0
    correction2 = 1 - beta2**step if bias_correction else 1.0
    with torch.no_grad():
        exp_avg.mul_(beta1).add_(grad, alpha=(1 - beta1) / grad_scale)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=(1 - beta2) / grad_scale**2)
        if decay:
            param.mul_(1 - lr * decay)
        _apply_update(param, exp_avg, exp_avg_sq, -lr / correction1, correction2, eps)
        if param_copy.numel():
            param_copy.copy_(param)
        trust_ratio.fill_(1.0)
    del weight_norms, update_norms
    return trust_ratio


class HostOptimizers:
    """A `cpu_*` op's optimizer registry (`create_*(optimizer_id, ...)`, `destroy_*`): the
    hyperparameters the update functions do not receive (Adam's `adamw_mode`)."""

    def __init__(self) -> None:
        self.adamw_mode: dict[int, bool] = {}

    def create_adam(self, optimizer_id: int, lr: float, beta1: float, beta2: float, eps: float,
                    weight_decay: float, adamw_mode: bool, should_log: bool = False) -> int:
        self.adamw_mode[optimizer_id] = bool(adamw_mode)
        return 0

    def destroy(self, optimizer_id: int, *args: Any) -> int:
        self.adamw_mode.pop(optimizer_id, None)
        return 0

    def adam_update(self, optimizer_id: int, step: int, lr: float, beta1: float, beta2: float,
                    eps: float, weight_decay: float, bias_correction: bool, param: torch.Tensor,
                    grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor) -> int:
        """csrc/adam/cpu_adam_impl.cpp `ds_adam_step`: one Adam(W) step on host tensors."""
        multi_tensor_adam(0, torch.zeros(1), [[grad], [param], [exp_avg], [exp_avg_sq]], lr, beta1,
                          beta2, eps, step, int(self.adamw_mode.get(optimizer_id, True)),
                          int(bias_correction), weight_decay)
        return 0


def adagrad_update(optimizer_id: int, step: int, lr: float, eps: float, weight_decay: float,
                   param: torch.Tensor, grad: torch.Tensor, exp_avg_sq: torch.Tensor) -> int:
    """csrc/adagrad/cpu_adagrad.cpp `ds_adagrad_step`: one Adagrad step on host tensors."""
    with torch.no_grad():
        if weight_decay:
            grad = grad.add(param, alpha=weight_decay)
        exp_avg_sq.addcmul_(grad, grad)
        param.addcdiv_(grad, exp_avg_sq.sqrt().add_(eps), value=-lr)
    return 0


def lion_update(optimizer_id: int, step: int, lr: float, beta1: float, beta2: float,
                weight_decay: float, param: torch.Tensor, grad: torch.Tensor,
                exp_avg: torch.Tensor) -> int:
    """csrc/lion/cpu_lion.cpp `ds_lion_step`: one Lion step on host tensors."""
    with torch.no_grad():
        update = exp_avg.mul(beta1).add_(grad, alpha=1 - beta1).sign_()
        if weight_decay:
            param.mul_(1 - lr * weight_decay)
        param.add_(update, alpha=-lr)
        exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)
    return 0


def _cpu_adam() -> dict[str, Callable[..., Any]]:
    optimizers = HostOptimizers()
    return {"create_adam": optimizers.create_adam, "destroy_adam": optimizers.destroy,
            "adam_update": optimizers.adam_update}


IN_PLACE_OPS: dict[str, Callable[[], dict[str, Callable[..., Any]]]] = {
    "fused_adam": lambda: {"multi_tensor_adam": multi_tensor_adam},  # FusedAdam: the update itself
    "fused_lion": lambda: {"multi_tensor_lion": _no_op},  # FusedLion
    "fused_lamb": lambda: {"lamb": lamb},  # FusedLamb: the kernel's buffers and the update
    "cpu_adam": _cpu_adam,  # DeepSpeedCPUAdam (ZeRO-Offload): host tensors
    "cpu_adagrad": lambda: {"create_adagrad": _no_op, "destroy_adagrad": _no_op,
                            "adagrad_update": adagrad_update},
    "cpu_lion": lambda: {"create_lion": _no_op, "destroy_lion": _no_op,
                         "lion_update": lion_update},
}
"""Op builder name -> a maker of the functions of its stand-in module."""


def _stand_in_loads(module: Any) -> Undo:
    builder = module.OpBuilder
    original = builder.load

    def load(self: Any, verbose: bool = False) -> Any:
        make_functions = IN_PLACE_OPS.get(getattr(self, "name", None) or "")
        if make_functions is None:
            return original(self, verbose)
        return SimpleNamespace(__name__=f"peakmem stand-in for {self.name}", **make_functions())

    builder.load = load

    def undo() -> None:
        builder.load = original

    return undo


ZERO_INIT_MODULE = "deepspeed.runtime.zero.partition_parameters"


def _dynamo_before_tensor_wrappers(module: Any) -> Undo:
    init = module.Init
    original = init._add_tensor_creation_wrappers

    def add_tensor_creation_wrappers(self: Any) -> Any:
        import torch._dynamo  # noqa: F401  (imported now, not under DeepSpeed's Tensor.__new__)

        return original(self)

    init._add_tensor_creation_wrappers = add_tensor_creation_wrappers

    def undo() -> None:
        init._add_tensor_creation_wrappers = original

    return undo


@register_library_patch("deepspeed_zero_init_dynamo")
@contextmanager
def deepspeed_zero_init_dynamo() -> Iterator[None]:
    with patch_on_import(ZERO_INIT_MODULE, _dynamo_before_tensor_wrappers):
        yield


@register_library_patch("deepspeed_fused_optimizer_ops")
@contextmanager
def deepspeed_fused_optimizer_ops() -> Iterator[None]:
    with ExitStack() as stack:
        for name in BUILDER_MODULES:
            stack.enter_context(patch_on_import(name, _stand_in_loads))
        yield

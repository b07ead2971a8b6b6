"""`torch.autocast("cuda")` on the capture device.

CUDA autocast lives at a dispatch key meta tensors do not have, so the capture applies its cast
policy itself (aten/src/ATen/autocast_mode.cpp): ops on the lower-precision list cast their
floating inputs (not float64) to the autocast dtype, ops on the fp32 list cast them to float32,
and softmax-like ops run in float32 when given lower-precision inputs. Casts of leaf tensors that
require grad (parameters) are cached until the outermost autocast region exits, as CUDA's weight
cast cache does. Inside an autocast op, nested ops are not cast again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._pytree import tree_map

from peakmem.cuda_rules.registry import (
    RuleContext,
    register_composite_rule,
    register_function_rule,
)
from peakmem.cuda_rules.saved_inputs import keep_saved_inputs
from peakmem.cuda_rules.true_device import is_meta

DEVICE_TYPE = "cuda"
_local = threading.local()


def active_dtype() -> torch.dtype | None:
    """The autocast dtype if CUDA autocast is on here (and we are not inside an autocast op)."""
    if getattr(_local, "inside", False) or not torch.is_autocast_enabled(DEVICE_TYPE):
        return None
    return torch.get_autocast_dtype(DEVICE_TYPE)


@contextmanager
def inside_autocast_op() -> Iterator[None]:
    previous = getattr(_local, "inside", False)
    _local.inside = True
    try:
        yield
    finally:
        _local.inside = previous


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and is_meta(value)
        and value.is_floating_point()
        and value.dtype != torch.float64
    )


def cast(ctx: RuleContext, value: Any, dtype: torch.dtype) -> Any:
    if not _eligible(value) or value.dtype == dtype:
        return value
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = ctx.autocast_cache
    cacheable = value.is_leaf and value.requires_grad
    if cacheable:
        hit = cache.get(id(value))
        if hit is not None and hit[0] is value and hit[1].dtype == dtype:
            return hit[1]
    converted = value.to(dtype)
    if cacheable:
        cache[id(value)] = (value, converted)
    return converted


def cast_all(ctx: RuleContext, args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
    return tree_map(lambda v: cast(ctx, v, dtype), args), tree_map(
        lambda v: cast(ctx, v, dtype), kwargs
    )


def run_lower_precision(ctx: RuleContext, call, args: tuple, kwargs: dict) -> Any:
    """Cast to the autocast dtype if autocast is on, then `call(*args, **kwargs)`."""
    dtype = active_dtype()
    if dtype is None:
        return call(*args, **kwargs)
    args, kwargs = cast_all(ctx, args, kwargs, dtype)
    with inside_autocast_op():
        return call(*args, **kwargs)


# `linear` is cast by its own rule (composite_compliance.py), which also picks ATen's branch.
_LOWER_PRECISION_COMPOSITES = [
    "matmul",
    "conv1d",
    "conv1d.padding",
    "conv2d",
    "conv2d.padding",
    "conv3d",
    "conv3d.padding",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "einsum",
    "bilinear",
]
# CUDA's fp32 list has no `cross_entropy_loss` (only the CPU's has): the composite runs as
# called, its `log_softmax(x, 1, x.scalar_type())` keeps the input's dtype (an explicit dtype:
# fp32_set_opt_dtype leaves it) and `nll_loss` casts the log-probabilities to float32.
_FP32_COMPOSITES = ["layer_norm", "group_norm", "nll_loss"]
_FP32_OPTIONAL_DTYPE = ["softmax.int", "log_softmax.int"]


@register_composite_rule(_LOWER_PRECISION_COMPOSITES)
def lower_precision(ctx: RuleContext, op, *args: Any, **kwargs: Any) -> Any:
    return run_lower_precision(ctx, op.decompose, args, kwargs)


@register_composite_rule(_FP32_COMPOSITES)
def full_precision(ctx: RuleContext, op, *args: Any, **kwargs: Any) -> Any:
    if active_dtype() is None:
        return op.decompose(*args, **kwargs)
    args, kwargs = cast_all(ctx, args, kwargs, torch.float32)
    with inside_autocast_op():
        return op.decompose(*args, **kwargs)


@register_composite_rule(_FP32_OPTIONAL_DTYPE)
def softmax_in_fp32(ctx: RuleContext, op, x: torch.Tensor, dim: int, dtype=None) -> Any:
    lower = x.dtype in (torch.float16, torch.bfloat16)
    if active_dtype() is not None and dtype is None and lower:
        dtype = torch.float32
    out = op.decompose(x, dim, dtype)
    return keep_saved_inputs(ctx, f"{op.__name__}", (x,), out)


# Ops with their own autograd kernels: cast where the job calls them directly.
_LOWER_PRECISION_FUNCTIONS = [
    torch.mm,
    torch.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.addbmm,
    torch.mv,
    torch.Tensor.mm,
    torch.Tensor.bmm,
    torch.Tensor.addmm,
    torch.Tensor.baddbmm,
]


@register_function_rule(_LOWER_PRECISION_FUNCTIONS)
def lower_precision_function(ctx: RuleContext, func, args: tuple, kwargs: dict) -> Any:
    if active_dtype() is None:
        return NotImplemented
    return run_lower_precision(ctx, func, args, kwargs)


# ATen's fp32 list (autocast_mode.h AT_FORALL_FP32: acos, asin, cosh, erfinv, exp, expm1, log,
# log10, log2, log1p, reciprocal, rsqrt, sinh, tan, pow (Tensor_Scalar, Tensor_Tensor, Scalar),
# softplus, ...): under CUDA autocast their floating inputs are cast to float32, so their
# outputs, and every op that promotes with them, are float32. transformers' `gelu_new`
# (NewGELUActivation: 0.5 * x * (1 + tanh(c * (x + 0.044715 * torch.pow(x, 3.0))))) thus runs
# its tail in float32 under bf16 autocast and saves float32 tensors for backward (tanh's output,
# the final product's factor). The pointwise ops, as the job calls them; in-place variants are
# not on the list (autocast leaves them alone).
_FP32_POINTWISE_NAMES = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow",
]
_FP32_FUNCTIONS = [
    *(getattr(torch, name) for name in _FP32_POINTWISE_NAMES),
    *(getattr(torch.Tensor, name) for name in _FP32_POINTWISE_NAMES),
    torch.Tensor.__pow__,
    torch.Tensor.__rpow__,
    torch.nn.functional.softplus,
]


@register_function_rule(_FP32_FUNCTIONS)
def full_precision_function(ctx: RuleContext, func, args: tuple, kwargs: dict) -> Any:
    if active_dtype() is None or kwargs.get("out") is not None:
        return NotImplemented  # `out=` overloads are not on autocast's lists
    args, kwargs = cast_all(ctx, args, kwargs, torch.float32)
    with inside_autocast_op():
        return func(*args, **kwargs)

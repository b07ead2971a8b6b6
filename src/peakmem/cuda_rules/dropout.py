"""Dropout: on CUDA, `dropout(x, p, train=True)` runs the fused `native_dropout` kernel, which
returns the output and a 1-byte-per-element mask saved for backward. The CPU/meta path instead
makes a noise tensor of x's dtype (4 bytes per element in fp32) and multiplies."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from peakmem.cuda_rules.registry import RuleContext, register_function_rule


def _fused_kernel_applies(x: torch.Tensor, p: float, training: bool) -> bool:
    # ATen Dropout.cpp: train && is_fused_kernel_acceptable(input, p) -> native_dropout.
    return training and 0 < p < 1 and x.numel() > 0


@register_function_rule([F.dropout, torch.dropout])
def dropout(ctx: RuleContext, func, args: tuple, kwargs: dict):
    names = ("input", "p", "training", "inplace") if func is F.dropout else ("input", "p", "train")
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    x = bound["input"]
    p = float(bound.get("p", 0.5))
    training = bool(bound.get("training", bound.get("train", True)))
    if bound.get("inplace", False) or not _fused_kernel_applies(x, p, training):
        return NotImplemented  # `dropout_` and no-op cases take the same path on CUDA
    output, _mask = torch.native_dropout(x, p, True)
    return output

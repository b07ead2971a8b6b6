"""Dropout: on CUDA, `dropout(x, p, train=True)` runs the fused `native_dropout` kernel, which
returns the output and a 1-byte-per-element mask saved for backward. The CPU/meta path instead
makes a noise tensor of x's dtype (4 bytes per element in fp32) and multiplies. This holds
wherever dropout is called from (nn.Dropout, attention's internal dropout, ...).

`native_dropout` itself (aten/src/ATen/native/cuda/Dropout.cu, `dropout<bool>`) allocates the
mask before the output; torch's meta kernel allocates the output first. The order decides which
cached blocks the two take (seen in allocator snapshots on an H100: mask, then output)."""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import (
    RuleContext,
    register_composite_rule,
    register_output_order,
)


def fused_kernel_applies(x: torch.Tensor, p: float, train: bool) -> bool:
    """ATen Dropout.cpp: `train && is_fused_kernel_acceptable(input, p)` on a CUDA tensor."""
    return train and 0 < p < 1 and x.numel() > 0


@register_composite_rule("dropout")
def dropout(ctx: RuleContext, op, x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    if fused_kernel_applies(x, p, train):
        output, _mask = torch.native_dropout(x, p, True)
        return output
    if not train or p == 0 or x.numel() == 0:
        return x  # ATen returns the input itself (decompose() would add a copy)
    return op.decompose(x, p, train)


# Dropout.cu `dropout<bool>`: `mask = at::empty_like(self, bool)`, then `ret = at::empty_like(self)`.
register_output_order(torch.ops.aten.native_dropout.default, (1, 0))

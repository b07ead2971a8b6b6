"""Ops whose output size depends on tensor values (`nonzero`, boolean-mask indexing) cannot know
it on fake tensors. The capture bounds them from above: every element counts as selected, so the
estimate never undercounts what such an op allocates."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.fx.experimental._config as fx_config

from peakmem.cuda_rules.registry import register_fused_kernel, register_runtime_patch


@register_runtime_patch("data_dependent_upper_bounds")
@contextmanager
def assume_all_selected() -> Iterator[None]:
    previous = fx_config.meta_nonzero_assume_all_nonzero
    fx_config.meta_nonzero_assume_all_nonzero = True
    try:
        yield
    finally:
        fx_config.meta_nonzero_assume_all_nonzero = previous


@register_fused_kernel("_unique2")
def unique_upper_bound(
    self: torch.Tensor, sorted: bool = True, return_inverse: bool = False,
    return_counts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`torch.unique` (no meta kernel in torch): every element counted as distinct, the bound
    for the values and the counts; the inverse is shaped like the input. CUDA returns empty
    tensors for the inverse and counts not asked for."""
    numel = self.numel()
    output = self.new_empty((numel,))
    inverse = self.new_empty(self.shape if return_inverse else (0,), dtype=torch.long)
    counts = self.new_empty((numel,) if return_counts else (0,), dtype=torch.long)
    return output, inverse, counts

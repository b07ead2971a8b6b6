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
    # a hidden option (a `delattr` on torch's config module, which `unittest.mock` does and
    # undoes) reads as an AttributeError: it is then the default, False
    previous = getattr(fx_config, "meta_nonzero_assume_all_nonzero", False)
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


@register_fused_kernel("bincount")
def bincount_of_minlength(
    self: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0,
) -> torch.Tensor:
    """`torch.bincount` (no meta kernel in torch): `max(minlength, self.max() + 1)` bins. With a
    `minlength`, as torchmetrics' classification metrics pass it (`num_classes` or its square
    for a confusion matrix), the values are taken to be below it, as they are for valid labels;
    without one the size has no bound and the op stays unsupported on fake tensors (auto mode
    reruns the job in eager mode). The bins are int64 counts, or sums in the weights' dtype for
    float32 weights and float64 for any other (SummaryOps.cu `_bincount_cuda`)."""
    if minlength <= 0:
        raise NotImplementedError("aten::bincount without minlength has a data-dependent size")
    if weights is None:
        dtype = torch.long
    else:
        dtype = torch.float if weights.dtype == torch.float else torch.double
    return self.new_empty((minlength,), dtype=dtype)

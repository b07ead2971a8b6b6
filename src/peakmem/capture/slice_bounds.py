"""Slices bounded by device scalars: `x[slice(n)]`, `x[:n]` with `n` a 0-d device tensor.

Python's slice parser reads a tensor bound with `__index__` from C++, where no torch-function
mode sees it: on a fake tensor that is `.item()` on meta and the job stopped (torchmetrics'
`gather_all_tensors` trims each rank's gathered state with `[slice(d) for d in item_size]`,
sizes that came back from an all_gather on the device). As on CUDA, the bound is read on the
host first (a host read: zeros in fake mode, real values in eager mode).

A 0-d integer tensor used as an index (`x[i]`, `x[i, :]`) is read the same way: PyTorch's
indexing turns it into a `select` at `i.item()` (diffusers' DDPMScheduler.previous_timestep:
`self.timesteps[index + 1]` with `index` from `nonzero()`, so every DDPMPipeline sampling loop
stopped fake mode); so is each one in a list index (`x[[i, j]]` builds its index tensor from
their values).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from peakmem.capture.tensor_overrides import register_override


def _host_bound(mode: Any, bound: Any) -> Any:
    if isinstance(bound, Tensor) and bound.is_meta:
        return int(mode.host_values(bound))
    return bound


def _integer_scalar(value: Any) -> bool:
    return (isinstance(value, Tensor) and value.is_meta and value.dim() == 0
            and not value.dtype.is_floating_point and not value.dtype.is_complex
            and value.dtype is not torch.bool)


def _host_slices(mode: Any, index: Any) -> Any:
    if _integer_scalar(index):
        return _host_bound(mode, index)
    if isinstance(index, slice):
        if not any(isinstance(b, Tensor) for b in (index.start, index.stop, index.step)):
            return index
        return slice(*(_host_bound(mode, b) for b in (index.start, index.stop, index.step)))
    if isinstance(index, tuple | list):
        converted = [_host_slices(mode, part) for part in index]
        if all(new is old for new, old in zip(converted, index, strict=True)):
            return index
        return type(index)(converted)
    return index


@register_override([Tensor.__getitem__])
def getitem_with_host_bounds(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    tensor, index = args
    return func(tensor, _host_slices(mode, index))


@register_override([Tensor.__setitem__])
def setitem_with_host_bounds(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    tensor, index, value = args
    return func(tensor, _host_slices(mode, index), value)

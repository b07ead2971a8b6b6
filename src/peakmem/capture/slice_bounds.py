"""Slices bounded by device scalars: `x[slice(n)]`, `x[:n]` with `n` a 0-d device tensor, and
indices that are 0-d integer or bool device tensors: `x[i]`, `x[:, i]`, `x[mask]`.

Python's slice parser reads a tensor bound with `__index__` from C++, where no torch-function
mode sees it: on a fake tensor that is `.item()` on meta and the job stopped (torchmetrics'
`gather_all_tensors` trims each rank's gathered state with `[slice(d) for d in item_size]`,
sizes that came back from an all_gather on the device). torch's indexing turns a 0-d integer
tensor index into a `select` at `tensor.item()`, and a 0-d bool (or uint8) one into a bool index
at `tensor.item<bool>()` (TensorIndexing.h `handleDimInMultiDimIndexing`; a device sync on
CUDA): timm's Kron optimizer picks a row with `A[j]`, `j` from `torch.max(..., 0)`, and
torchmetrics' `R2Score` computes `raw_scores[cond] = ...` with `cond` a 0-d bool. As on
CUDA, the bound or index is read on the host first (a host read: zeros in fake mode, real
values in eager mode).

A 0-d integer tensor inside a list index is read the same way (`x[[i, j]]` builds its index
tensor from their values; diffusers' DDPMScheduler.previous_timestep indexes
`self.timesteps[index + 1]` with `index` from `nonzero()`, so every DDPMPipeline sampling loop
stopped fake mode before).
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


def _device_scalar_index(mode: Any, value: Any) -> Any:
    """A 0-d integer or bool device tensor used as an index, read on the host as indexing reads
    it (`item<int64_t>()`: a select; `item<bool>()` for bool and uint8 ones: a bool index);
    anything else unchanged."""
    if not (isinstance(value, Tensor) and value.is_meta and value.dim() == 0):
        return value
    if value.dtype in (torch.bool, torch.uint8):
        return bool(mode.host_values(value))
    if value.dtype.is_floating_point or value.dtype.is_complex:
        return value  # not an index: the job's own error, as on CUDA
    return int(mode.host_values(value))


def _integer_scalar(value: Any) -> bool:
    return (isinstance(value, Tensor) and value.is_meta and value.dim() == 0
            and not value.dtype.is_floating_point and not value.dtype.is_complex
            and value.dtype is not torch.bool)


def _host_slices(mode: Any, index: Any, *, top: bool = True) -> Any:
    if top and isinstance(index, Tensor):
        return _device_scalar_index(mode, index)
    if not top and _integer_scalar(index):
        return _host_bound(mode, index)
    if isinstance(index, slice):
        if not any(isinstance(b, Tensor) for b in (index.start, index.stop, index.step)):
            return index
        return slice(*(_host_bound(mode, b) for b in (index.start, index.stop, index.step)))
    if isinstance(index, tuple | list):
        # a tuple's parts are indices; a list is one advanced index: only its 0-d integer
        # tensors are read (to build the index tensor), other tensors stay
        converted = [_host_slices(mode, part, top=isinstance(index, tuple)) for part in index]
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

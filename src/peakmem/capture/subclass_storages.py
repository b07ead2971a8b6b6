"""The storages behind tensor subclasses.

A wrapper subclass (`torch.Tensor._make_wrapper_subclass`: torchao's `OptimState8bit`,
`OptimState4bit`, `OptimStateFp8`, `NF4Tensor`, float8 tensors, affine-quantized weights,
`DTensor`) has no memory of its own: its outer tensor reports the shape and dtype the job sees
(often fp32), and its memory is the inner tensors it holds (uint8 codes, block scales, a lookup
table; a DTensor's local shard). The capture counts each inner storage once, at its real size,
and never the outer one: `storage_tensors` replaces every traceable wrapper subclass
(`__tensor_flatten__`) by its inner tensors, recursively.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

MAX_DEPTH = 8
"""Nesting of subclasses followed (a DTensor of an OptimState8bit is 2)."""


_TENSOR = torch.Tensor


def inner_tensors(tensor: torch.Tensor, depth: int = 0) -> list[torch.Tensor]:
    """The plain tensors holding a wrapper subclass's memory (the tensor itself if it is not
    one)."""
    if depth >= MAX_DEPTH or not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    found: list[torch.Tensor] = []
    for name in names:
        inner = getattr(tensor, name, None)
        if isinstance(inner, torch.Tensor):
            found.extend(inner_tensors(inner, depth + 1))
    return found


def storage_tensors(flat: list[Any]) -> list[Any]:
    """`flat` with each wrapper subclass replaced by its inner tensors (`flat` itself, unchanged,
    when it holds none: the common case costs one pass over type checks)."""
    for value in flat:  # the recorder's hot path: a plain loop, no generator
        if type(value) is not _TENSOR and isinstance(value, _TENSOR):
            break
    else:
        return flat
    expanded: list[Any] = []
    for value in flat:
        if isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value):
            expanded.extend(inner_tensors(value))
        else:
            expanded.append(value)
    return expanded


def is_wrapper(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and is_traceable_wrapper_subclass(tensor)

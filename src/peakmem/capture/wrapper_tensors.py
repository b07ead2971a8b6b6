"""Wrapper tensor subclasses (DTensor, and others built with `_make_wrapper_subclass`) hold no
device memory of their own: their inner tensors do (a DTensor's local shard). The wrapper's
storage has the global shape's size and is not an allocation.

When the capture's recorder sees an op on such a subclass, the subclass's own dispatch runs the
op on the inner tensors with the recorder popped (torch's mode/subclass order), so those inner
allocations are recorded from the op's outputs instead: :func:`storage_holders` replaces each
wrapper by its inner tensors (recursively)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def storage_holders(values: Iterable[Any]) -> Iterator[Any]:
    """`values` with every traceable wrapper subclass replaced by its inner tensors."""
    for value in values:
        if type(value) in _PLAIN or not isinstance(value, torch.Tensor):
            yield value
        elif is_traceable_wrapper_subclass(value):
            names, _ = value.__tensor_flatten__()
            yield from storage_holders(getattr(value, name) for name in names)
        else:
            yield value

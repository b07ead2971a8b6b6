"""Tensor methods the job replaced, seen as the methods they replaced.

torch's C code hands a Tensor method call to the torch function modes as
`getattr(torch.Tensor, name)`, looked up at call time: after the job's
`torch.Tensor.to = logged_to` (a wrapper that calls the original), the capture's modes see
`logged_to`, not `Tensor.to`, and their registries (keyed by the original methods) pass the
call on as an unknown function: the real `to("cuda")` on a CPU-only torch. `canonical(func)`
is the original method a replacement stands for (the function itself where it replaces
none), so each mode answers the call as it answers the original's. `ORIGINAL` holds the
methods as they were when peakmem was imported, before any job ran: what peakmem's own code
calls where a job's replacement must not run in its place (`.cuda()` moves a tensor with the
original `to`, not a `to` the job made a no-op).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch

ORIGINAL: MappingProxyType[str, Any] = MappingProxyType(
    {name: getattr(torch.Tensor, name) for name in dir(torch.Tensor)})
"""`getattr(torch.Tensor, name)` for each name, as peakmem found them."""

_ORIGINALS = {id(value) for value in ORIGINAL.values()}
_CACHE_LIMIT = 10_000


def _original_of(func: Any) -> Any:
    if id(func) in _ORIGINALS:
        return func
    for owner in (torch.Tensor, torch._C.TensorBase):
        for name, value in vars(owner).items():
            if value is func and name in ORIGINAL and ORIGINAL[name] is not func:
                return ORIGINAL[name]
    return func


class _Canonical(dict):
    """func -> the original it stands for; a function seen the first time is looked up."""

    def __missing__(self, func: Any) -> Any:
        original = _original_of(func)
        if len(self) >= _CACHE_LIMIT:  # functions made per call: start over, bounded
            self.clear()
        self[func] = original
        return original


_CANONICAL = _Canonical()


def canonical(func: Any) -> Any:
    """The original Tensor method `func` replaced, else `func`."""
    try:
        return _CANONICAL[func]
    except TypeError:  # an unhashable callable
        return _original_of(func)

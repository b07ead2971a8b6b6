"""The tensors among an op's arguments, as a pytree flatten finds them, without its cost.

The capture's torch-function modes and the recorder ask on every call which tensors an op
reads (`torch.utils._pytree.tree_flatten`, then the `Tensor` leaves): a pytree flatten costs a
few microseconds per leaf (a node-type lookup, a namedtuple check and a TreeSpec per node), and
an optimizer's foreach call passes hundreds of tensors. `tensors_in(value)` walks plain tuples,
lists and dicts itself and hands any other container (namedtuples, OrderedDict, torch.Size,
return types, registered nodes) to `tree_flatten`, so it returns the same tensors in the same
order as

    [leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

Tensor = torch.Tensor
_TENSORS = frozenset({Tensor, torch.nn.Parameter})
# leaves a pytree never descends into: skipped without a lookup
_SCALARS = frozenset({int, float, bool, str, complex, type(None), torch.dtype, torch.device,
                      torch.layout, torch.memory_format})
LEAF_TYPES = _SCALARS
"""Types of values a pytree never descends into and that are no tensors (callers' own walks)."""


def tensors_in(value: Any) -> list[Tensor]:
    """The tensors in `value` (nested in tuples, lists, dicts and any pytree node), in
    `tree_flatten`'s order."""
    found: list[Tensor] = []
    _gather(value, found)
    return found


def _gather(value: Any, found: list[Tensor]) -> None:
    kind = type(value)
    if kind is tuple or kind is list:
        for item in value:
            item_kind = type(item)
            if item_kind in _TENSORS:
                found.append(item)
            elif item_kind not in _SCALARS:
                _gather(item, found)
    elif kind is dict:
        for item in value.values():
            _gather(item, found)
    elif kind in _TENSORS:
        found.append(value)
    elif kind not in _SCALARS:  # another node type, a tensor subclass or an unknown leaf
        found.extend(leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, Tensor))

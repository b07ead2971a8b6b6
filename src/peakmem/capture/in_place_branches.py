"""ATen's composite-compliant branches that the capture takes and CUDA does not.

ATen's `isTensorSubclassLike` / `areAnyTensorSubclassLike` (aten/src/ATen/TensorSubclassLikeUtils.h)
is true for every tensor while a Python dispatch mode runs, and for meta tensors: under the
capture, code that writes in place into a temporary it made for plain tensors makes a new tensor
instead (`result.scatter_add(...)` for `result.scatter_add_(...)`), and the trace holds a
temporary the GPU run never allocates. Most of these are in backward formulas, where the extra
tensor is as big as an input of the forward op, at the start of backward: at the peak.

Each branch here names where the code runs (an autograd node's `name()` while its backward
formula runs, capture/grad_accumulation.py; or a composite op whose cuda_rules rule runs ATen's
decomposition inside `cuda_rules.composite_compliance.composite_branch`), the out-of-place op
the capture sees, and the rest of the C++ condition (e.g. grad mode off). The recorder asks
`in_place_branch` for every op; the session then replays the op as in place when its first
argument's storage is released right after the op (the formula dropped the temporary for the
result: session.CaptureSession.expect_in_place), so an op on a tensor that lives on is never
replayed.

Sources (read at one pytorch revision; the gather, index and SDPA branches are also in copies
from the torch <= 2.4 era): `gather_backward`, `index_select_backward_symint` and
`masked_select_backward` (aten/src/ATen/native/TensorAdvancedIndexing.cpp), `index_backward`,
`take_backward` and `binary_cross_entropy_with_logits_backward`
(torch/csrc/autograd/FunctionsManual.cpp), `_scaled_dot_product_attention_math`
(aten/src/ATen/native/transformers/attention.cpp).
docs/capture.md "ATen's subclass-like branches" lists the branches audited, ruled or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from peakmem.capture.grad_accumulation import current_node
from peakmem.cuda_rules.composite_compliance import SDPA_MATH, active_composite

aten = torch.ops.aten

Condition = Callable[[tuple, dict], bool]
"""The rest of the C++ condition for the in-place step, from the op's arguments."""


def always(_args: tuple, _kwargs: dict) -> bool:
    return True


def grad_mode_off(_args: tuple, _kwargs: dict) -> bool:
    """`... || at::GradMode::is_enabled()` takes the out-of-place step: in backward, grad mode
    is on with `create_graph=True` only."""
    return not torch.is_grad_enabled()


def accumulates(args: tuple, kwargs: dict) -> bool:
    """`index_put(indices, values, accumulate=True)` / `put(index, source, accumulate=True)`."""
    value = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    return bool(value)


@dataclass(frozen=True)
class InPlaceBranch:
    """Where `op` runs out of place under the capture and in place on CUDA."""

    where: str
    """An autograd node's name (its backward formula), or a composite op marked by its rule."""
    op: Any
    """The out-of-place aten overload the capture sees; CUDA runs its in-place form."""
    when: Condition
    source: str
    """The C++ function it comes from."""

    @property
    def name(self) -> str:
        return f"{self.where}:{self.op.overloadpacket.__name__}"


_BRANCHES: dict[tuple[str, Any], InPlaceBranch] = {}
_OPS: set[Any] = set()


def register_branch(where: str, op: Any, when: Condition, source: str) -> None:
    key = (where, op)
    if key in _BRANCHES:
        raise ValueError(f"in-place branch registered twice: {where} {op}")
    _BRANCHES[key] = InPlaceBranch(where, op, when, source)
    _OPS.add(op)


def iter_branches() -> Iterator[InPlaceBranch]:
    return iter(_BRANCHES.values())


# -- backward formulas ------------------------------------------------------------------------
# `result = grad.new_zeros(self.sizes()); result.scatter_add_(dim, index, grad)`: the
# subclass branch returns `result.scatter_add(...)` (sparse_grad=True takes no scatter).
register_branch("GatherBackward0", aten.scatter_add.default, always, "gather_backward")
# `index_backward(grad.new_zeros(self.sizes()), indices, grad)`: `_index_put_impl_(zeros,
# indices, grad, accumulate=true, unsafe=true)` for plain tensors, else `zeros.index_put(...)`.
register_branch("IndexBackward0", aten.index_put.default, accumulates, "index_backward")
# `grad.new_zeros(self_sizes).index_add_(dim, index, grad)`, else `.index_add(...)`
# (index_select_backward_symint, TensorAdvancedIndexing.cpp: `isTensorSubclassLike(index)`).
register_branch("IndexSelectBackward0", aten.index_add.default, always,
                "index_select_backward_symint")
# `result = zeros_like(input.expand(...)); result.masked_scatter_(mask, grad)`, else
# `result.masked_scatter(mask, grad)` (masked_select_backward, TensorAdvancedIndexing.cpp).
register_branch("MaskedSelectBackward0", aten.masked_scatter.default, always,
                "masked_select_backward")
# `zeros_like(self).put_(indices, grad, true)`, else `.put(...)`.
register_branch("TakeBackward0", aten.put.default, accumulates, "take_backward")
# Without pos_weight: `input.sigmoid().sub_(target)`, then `grad_input.mul_(grad)` and
# `grad_input.mul_(weight)`, all out of place when grad mode is on (create_graph). The
# pos_weight chain (`t.add(1).sub_(target).mul_(sigmoid).sub_(t)`) keeps its temporaries to
# the end of the expression: its operands are not released right after each op, so it stays
# out of place here (one extra input-sized tensor at a time).
for _op in (aten.sub.Tensor, aten.mul.Tensor):
    register_branch("BinaryCrossEntropyWithLogitsBackward0", _op, grad_mode_off,
                    "binary_cross_entropy_with_logits_backward")

# -- composite ops (forward) ------------------------------------------------------------------
# `attn = matmul(q, k^T * s); attn.add_(*attn_mask)` (else `attn = attn.add(*attn_mask)`):
# an extra B x H x L x S score matrix when SDPA takes the math path with a mask.
register_branch(SDPA_MATH, aten.add.Tensor, always, "_scaled_dot_product_attention_math")


def has_in_place_branch(func: Any) -> bool:
    """Whether a branch is registered for `func` (else `in_place_branch` answers None)."""
    return func in _OPS


def in_place_branch(func: Any, args: tuple, kwargs: dict, out: Any) -> InPlaceBranch | None:
    """The branch whose out-of-place op `func` just made `out` from `args[0]`, where CUDA writes
    into `args[0]` (same layout as the result, and the rest of the C++ condition holds)."""
    if func not in _OPS:
        return None
    for where in _active_places():
        branch = _BRANCHES.get((where, func))
        if branch is None:
            continue
        if _same_layout(args, out) and branch.when(args, kwargs):
            return branch
        return None
    return None


def _active_places() -> list[str]:
    places = []
    composite = active_composite()
    if composite is not None:
        places.append(composite)
    node = current_node()
    if node is not None:
        places.append(node)
    return places


def _same_layout(args: tuple, out: Any) -> bool:
    """An in-place op keeps its self's layout: the capture's result must match it (same shape
    and dtype, dense), else CUDA's in-place result differs and nothing is replayed."""
    old = args[0] if args else None
    return (
        isinstance(old, torch.Tensor)
        and isinstance(out, torch.Tensor)
        and old.is_meta
        and old.layout == torch.strided
        and old.dtype == out.dtype
        and old.shape == out.shape
        and is_non_overlapping_and_dense_or_false(old)
    )

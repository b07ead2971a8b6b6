"""`index_put` with `accumulate=True` on CUDA: the sort path (aten/src/ATen/native/cuda/
Indexing.cu `index_put_with_sort_kernel`, torch 2.x), which is also the backward of advanced
indexing (`index_backward`: `_index_put_impl_(zeros, indices, grad, accumulate=true)`).

Before its kernel runs, everything below is live; all of it is freed when the op returns:

  self_          self.contiguous() where self is not contiguous (copied back at the end);
  linearIndex    [n] int64, n = the broadcast index shape's numel (`computeLinearIndex`: per
                 index tensor `wrapIndexOnce(index).remainder(size) * stride`, the first
                 becomes linearIndex, the others are added into it);
  expandedValue  value expanded to [before, n, slice] and made contiguous (a copy where the
                 value is not contiguous, e.g. a slice of cat's gradient);
  src_           self_ permuted so the indexed dims come first, made contiguous (a copy where
                 the indexed dims are not adjacent: `transposeToFrontAndInvPerm`);
  sorted_indices, orig_indices [n] int64, and a range [n] int64 with cub's radix-sort temp
                 storage around the sort (the range freed after it).

cub's temp storage is modelled as the sort's alternate key/value buffers (2 x n x 8 bytes), as
for the embedding backward (cuda_rules/embedding.py). Without accumulate, index_put runs a
TensorIterator kernel over restrided views: nothing of its own.

The scratch is released before the op's output is recorded: the capture sees the backward's
`index_put` out of place and replays it in place into the zeros (capture/in_place_branches.py),
which needs the output to be the op's last event. On CUDA the scratch lives while the kernel
writes into `self`; for the in-place form (every backward) that is the same peak. The
functional `index_put(..., accumulate=True)` clones `self` first, so there the scratch and the
clone overlap on the GPU, not here (its peak is understated by at most the smaller of the two).
"""

from __future__ import annotations

import math

import torch

from peakmem.cuda_rules.registry import RuleContext, register_op_rule

aten = torch.ops.aten
_OP = "index_put_accumulate[scratch]"
_INDEX_BYTES = 8  # int64 (int32 indices are converted to int64 first)


def _adjacent(defined: list[bool]) -> bool:
    """`hasContiguousSubspace`: the defined indices form one run of dims."""
    positions = [i for i, d in enumerate(defined) if d]
    return not positions or positions[-1] - positions[0] + 1 == len(positions)


def _accumulate_scratch(ctx: RuleContext, self, indices, value):
    index_tensors = [i for i in indices if isinstance(i, torch.Tensor)]
    if not index_tensors or any(i.dtype in (torch.bool, torch.uint8) for i in index_tensors):
        yield  # masks expand into data-dependent index tensors: not modelled
        return
    shape = torch.broadcast_shapes(*(tuple(i.shape) for i in index_tensors))
    n = math.prod(shape)
    defined = [isinstance(i, torch.Tensor) for i in indices]
    defined += [False] * (self.dim() - len(defined))
    if n == 0 or self.numel() == 0:
        yield
        return
    element = self.element_size()
    live: list[int] = []

    def scratch(nbytes: int) -> int:
        ident = ctx.scratch(nbytes, category="temporary", op=_OP)
        live.append(ident)
        return ident

    if not self.is_contiguous():
        scratch(self.numel() * element)  # self_
    index_bytes = n * _INDEX_BYTES
    for position in range(len(index_tensors)):  # remainder, then * stride (then added in)
        remainder = ctx.scratch(index_bytes, category="temporary", op=_OP)
        product = ctx.scratch(index_bytes, category="temporary", op=_OP)
        ctx.release(remainder)
        if position == 0:
            live.append(product)  # linearIndex
        else:
            ctx.release(product)
    adjacent = _adjacent(defined)
    sizes = list(self.shape)
    if adjacent:
        first = defined.index(True)
        last = len(defined) - 1 - defined[::-1].index(True)
        before = math.prod(sizes[:first])
        after = math.prod(sizes[last + 1 :])
    else:  # indexed dims transposed to the front
        before = 1
        after = math.prod(s for s, d in zip(sizes, defined, strict=True) if not d)
    expanded = before * n * after
    if value.numel() < expanded or not value.is_contiguous():
        scratch(expanded * value.element_size())  # expandedValue
    if not adjacent:
        scratch(self.numel() * element)  # src_ (permuted: not contiguous)
    scratch(index_bytes)  # sorted_indices
    scratch(index_bytes)  # orig_indices
    arange = ctx.scratch(index_bytes, category="temporary", op=_OP)
    ctx.transient(2 * index_bytes, category="workspace", op="cub_radix_sort_temp")
    ctx.release(arange)
    for ident in reversed(live):
        ctx.release(ident)
    yield


_SCHEMA = ("self", "indices", "values", "accumulate", "unsafe")


@register_op_rule([aten.index_put, aten.index_put_, aten._index_put_impl_])
def index_put_accumulate(ctx: RuleContext, op, args: tuple, kwargs: dict):
    bound = dict(zip(_SCHEMA, args, strict=False)) | kwargs
    if not bound.get("accumulate", False):
        yield
        return
    yield from _accumulate_scratch(ctx, bound["self"], list(bound["indices"]), bound["values"])

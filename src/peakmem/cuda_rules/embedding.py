"""`embedding_dense_backward` on CUDA (aten/src/ATen/native/cuda/Embedding.cu and
EmbeddingBackwardKernel.cu). Up to 3072 indices (without scale_grad_by_freq) one kernel writes a
zeroed grad_weight. Above that, the indices are radix-sorted and segmented, with scratch live
around the output:

  before grad_weight: sorted_indices, orig_indices, arange(n) [index dtype, n each];
                      cub radix-sort temp storage (alloc/free); arange freed;
                      count [n] with scale_grad_by_freq
  after grad_weight:  segment_offsets [n], num_of_segments [1 x int64],
                      partials_per_segment [S], partials_per_segment_offset [S],
                      num_of_partial_segments [1 x int64], partial_segment_offset [P],
                      grad_weight_per_segment [P x dim, fp32 for half/bf16]; all freed when the
                      kernel returns.
  (`embedding_backward_cuda_kernel`: S = max_segments = min(n, num_weights) and P =
  max_partial_segment = n / NROWS_PER_THREAD + max_segments with NROWS_PER_THREAD = 10: the
  sync-free upper bounds, torch 2.x.)
`_embedding_bag_backward` (EmbeddingBag.cu `_embedding_bag_dense_backward_cuda`, modes sum and
mean) runs the same sort and `embedding_backward_cuda_kernel` for any number of indices (it has no
direct kernel), after `grad.contiguous()`: each bag table's slice of a stacked gradient is a
strided view, copied first and freed when the op returns. Mode max scatters with atomics into the
zeroed grad_weight (no scratch); sparse gradients take another path (not modelled here).
The meta kernels allocate only grad_weight. cub's temp-storage sizes (sort, unique_by_key,
exclusive_sum) are modelled as the sort's alternate key/value buffers (2 x n x index size); the
small ones are left out (assumed, not measured).
"""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import RuleContext, register_op_rule

aten = torch.ops.aten
DIRECT_KERNEL_MAX_INDICES = 3072
NROWS_PER_THREAD = 10  # EmbeddingBackwardKernel.cu
_OP = "embedding_dense_backward[scratch]"
_SCHEMA = ("grad_output", "indices", "num_weights", "padding_idx", "scale_grad_by_freq")


@register_op_rule(aten.embedding_dense_backward)
def embedding_dense_backward(ctx: RuleContext, op, args: tuple, kwargs: dict):
    bound = dict(zip(_SCHEMA, args, strict=False)) | kwargs
    grad, indices = bound["grad_output"], bound["indices"]
    scale_grad_by_freq = bool(bound["scale_grad_by_freq"])
    if indices.numel() <= DIRECT_KERNEL_MAX_INDICES and not scale_grad_by_freq:
        yield
        return
    yield from sorted_segments_backward(
        ctx, grad, indices, int(bound["num_weights"]), scale_grad_by_freq, _OP
    )


_BAG_OP = "_embedding_bag_backward[scratch]"
_BAG_SCHEMA = (
    "grad", "indices", "offsets", "offset2bag", "bag_size", "maximum_indices", "num_weights",
    "scale_grad_by_freq", "mode", "sparse", "per_sample_weights", "padding_idx",
)
_DENSE_BAG_SCHEMA = (
    "grad", "indices", "offset2bag", "bag_size", "maximum_indices", "num_weights",
    "scale_grad_by_freq", "mode", "per_sample_weights", "padding_idx",
)
MODE_MAX = 2


def _embedding_bag_backward(ctx: RuleContext, bound: dict):
    grad, indices = bound["grad"], bound["indices"]
    if bound.get("sparse") or int(bound["mode"]) == MODE_MAX or indices.numel() == 0:
        yield
        return
    copy = None
    if not grad.is_contiguous():  # `grad_.contiguous()` in _embedding_bag_dense_backward_cuda
        copy = ctx.scratch(grad.numel() * grad.element_size(), category="temporary", op=_BAG_OP)
    yield from sorted_segments_backward(
        ctx, grad, indices, int(bound["num_weights"]), bool(bound["scale_grad_by_freq"]), _BAG_OP
    )
    if copy is not None:
        ctx.release(copy)


@register_op_rule(aten._embedding_bag_backward)
def embedding_bag_backward(ctx: RuleContext, op, args: tuple, kwargs: dict):
    yield from _embedding_bag_backward(ctx, dict(zip(_BAG_SCHEMA, args, strict=False)) | kwargs)


@register_op_rule(aten._embedding_bag_dense_backward)
def embedding_bag_dense_backward(ctx: RuleContext, op, args: tuple, kwargs: dict):
    bound = dict(zip(_DENSE_BAG_SCHEMA, args, strict=False)) | kwargs
    yield from _embedding_bag_backward(ctx, bound)


def sorted_segments_backward(
    ctx: RuleContext, grad, indices, num_weights: int, scale_grad_by_freq: bool, op: str
):
    """The radix sort of the indices and `embedding_backward_cuda_kernel`'s segment buffers
    around grad_weight (the op's output, allocated at the `yield`)."""
    n = indices.numel()
    index_bytes = n * indices.element_size()
    temp = "temporary"

    def scratch(nbytes: int) -> int:
        return ctx.scratch(nbytes, category=temp, op=op)

    sorted_indices, orig_indices = scratch(index_bytes), scratch(index_bytes)
    arange = scratch(index_bytes)
    ctx.transient(2 * index_bytes, category="workspace", op="cub_radix_sort_temp")
    ctx.release(arange)
    count = scratch(index_bytes) if scale_grad_by_freq else None

    yield  # grad_weight (the op's output) is allocated here

    dim = grad.shape[-1]
    low_precision = grad.dtype in (torch.float16, torch.bfloat16)
    accumulator = 4 if low_precision else grad.element_size()
    index_size = indices.element_size()
    max_segments = min(n, num_weights)
    max_partial_segments = n // NROWS_PER_THREAD + max_segments
    segment_buffers = [
        scratch(index_bytes),  # segment_offsets
        scratch(8),  # num_of_segments
        scratch(max_segments * index_size),  # partials_per_segment
        scratch(max_segments * index_size),  # partials_per_segment_offset
        scratch(8),  # num_of_partial_segments
        scratch(max_partial_segments * index_size),  # partial_segment_offset
    ]
    per_segment = scratch(max_partial_segments * dim * accumulator)  # grad_weight_per_segment
    ctx.release(per_segment)
    for ident in reversed(segment_buffers):
        ctx.release(ident)
    for ident in (count, orig_indices, sorted_indices):
        if ident is not None:
            ctx.release(ident)

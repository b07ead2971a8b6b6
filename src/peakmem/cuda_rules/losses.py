"""Loss kernels whose CUDA implementation allocates more than the meta kernel's outputs
(aten/src/ATen/native/Loss.cpp, aten/src/ATen/native/cuda/Loss.cu; torch 2.4-2.6). The meta
kernels allocate only the (reduced) output, so these allocations are added:

- mse_loss, smooth_l1_loss (beta > 0), reduced: `TORCH_IMPL_FUNC(mse_loss_out)` makes a
  full-size `loss` through a TensorIterator after the output, reduces it with mean_out/sum_out
  into the output and frees it;
- huber_loss, reduced: `loss = at::empty_like(input)` before the output, then
  `apply_loss_reduction(loss)` makes the output; loss freed on return;
- binary_cross_entropy (CUDA, Loss.cu `binary_cross_entropy_out_cuda`): `loss = empty_like(input)`
  is the output; reduced, `loss_reduced = loss.mean()` and `loss.resize_as_(loss_reduced)`, which
  keeps the full-size storage: the returned scalar holds input-size bytes until it dies;
- binary_cross_entropy_with_logits (CompositeExplicitAutograd, Loss.cpp): its internal ops run
  below the recorder on meta. On CUDA: `log_sigmoid(input)` (log_sigmoid_forward: output + an
  empty buffer), with pos_weight `(pos_weight - 1).mul(target).add_(1)`, then
  `(1 - target).mul_(input).sub_(...)` and the reduction; the temporaries die on return.
"""

from __future__ import annotations

import torch

from peakmem.cuda_rules.reductions import add_reduction_scratch
from peakmem.cuda_rules.registry import RuleContext, register_fused_kernel, register_op_rule

aten = torch.ops.aten
REDUCTION_NONE = 0


def _broadcast_bytes(*tensors: torch.Tensor | None, dtype: torch.dtype | None = None) -> int:
    present = [t for t in tensors if isinstance(t, torch.Tensor)]
    shape = torch.broadcast_shapes(*(t.shape for t in present))
    if dtype is None:
        dtype = present[0].dtype
        for t in present[1:]:
            dtype = torch.promote_types(dtype, t.dtype)
    numel = 1
    for size in shape:
        numel *= size
    return numel * torch.empty((), dtype=dtype, device="meta").element_size()


def _reduction(args: tuple, kwargs: dict, index: int) -> int:
    if "reduction" in kwargs:
        return int(kwargs["reduction"])
    return int(args[index]) if len(args) > index else 1  # Mean is the schema default


@register_op_rule([aten.mse_loss, aten.smooth_l1_loss])
def pointwise_loss_before_reduction(ctx: RuleContext, op, args: tuple, kwargs: dict, out) -> None:
    if _reduction(args, kwargs, 2) == REDUCTION_NONE:
        return
    if op.overloadpacket is aten.smooth_l1_loss:
        beta = kwargs.get("beta", args[3] if len(args) > 3 else 1.0)
        if beta == 0:  # l1_loss_out: no full-size temporary in this kernel
            return
    nbytes = _broadcast_bytes(args[0], args[1])
    name = op.overloadpacket.__name__
    loss = ctx.scratch(nbytes, category="temporary", op=f"{name}[loss]")
    # mean_out / sum_out of the full-size loss: a CUDA reduce kernel (reductions.py)
    add_reduction_scratch(ctx, _full_size(args[0], args[1]), None, name)
    ctx.release(loss)


def _full_size(*tensors: torch.Tensor) -> torch.Tensor:
    """A contiguous meta tensor shaped like the broadcast of `tensors` (for reduction configs)."""
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    return torch.empty(shape, dtype=tensors[0].dtype, device="meta")


@register_op_rule(aten.huber_loss)
def huber_loss_before_reduction(ctx: RuleContext, op, args: tuple, kwargs: dict):
    if _reduction(args, kwargs, 2) == REDUCTION_NONE:
        yield
        return
    loss = ctx.scratch(
        args[0].numel() * args[0].element_size(), category="temporary", op="huber_loss[loss]"
    )
    yield
    add_reduction_scratch(ctx, _full_size(args[0]), None, "huber_loss")  # loss.mean() / sum()
    ctx.release(loss)


@register_fused_kernel("binary_cross_entropy")
def binary_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    reduction: int = 1,
) -> torch.Tensor:
    """`loss = empty_like(input)`, resized in place to the reduced scalar: its storage stays."""
    loss = torch.empty_like(input)
    if reduction != REDUCTION_NONE:
        loss.resize_(())
    return loss


@register_op_rule(aten.binary_cross_entropy)
def binary_cross_entropy_reduced(ctx: RuleContext, op, args: tuple, kwargs: dict, out) -> None:
    if _reduction(args, kwargs, 3) == REDUCTION_NONE:
        return
    # loss.mean() / loss.sum(): a scalar (its reduce kernel's staging buffer first), copied into
    # the resized loss, then freed
    reduced = ctx.scratch(out.element_size(), category="temporary", op="binary_cross_entropy[reduced]")
    add_reduction_scratch(ctx, _full_size(args[0]), None, "binary_cross_entropy")
    ctx.release(reduced)


_BCE_LOGITS_SCHEMA = ("input", "target", "weight", "pos_weight", "reduction")


@register_op_rule(aten.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(ctx: RuleContext, op, args: tuple, kwargs: dict):
    bound = dict(zip(_BCE_LOGITS_SCHEMA, args, strict=False)) | kwargs
    input, target = bound["input"], bound["target"]
    pos_weight = bound.get("pos_weight")
    reduction = int(bound.get("reduction", 1))
    name = "binary_cross_entropy_with_logits[scratch]"
    idents = [ctx.scratch(input.numel() * input.element_size(), category="temporary", op=name)]
    if isinstance(pos_weight, torch.Tensor):
        # (pos_weight - 1) dies at the end of its statement; log_weight lives on
        minus_one = ctx.scratch(pos_weight.numel() * pos_weight.element_size(), category="temporary", op=name)
        idents.append(ctx.scratch(_broadcast_bytes(pos_weight, target), category="temporary", op=name))
        ctx.release(minus_one)
    if reduction != REDUCTION_NONE:
        # (1 - target), made into the unreduced loss in place; without a reduction it is the output
        idents.append(ctx.scratch(target.numel() * target.element_size(), category="temporary", op=name))
    yield
    if reduction != REDUCTION_NONE:  # apply_loss_reduction: a CUDA reduce kernel
        add_reduction_scratch(ctx, _full_size(input, target), None, "binary_cross_entropy_with_logits")
    for ident in reversed(idents):
        ctx.release(ident)

"""Normalization kernels: what CUDA allocates besides the outputs the meta kernels make.

Batch norm (torch 2.4-2.6). `batch_norm` calls `_batch_norm_impl_index`
(aten/src/ATen/native/Normalization.cpp; the `_batch_norm_with_update` route is still commented
out there), which picks `cudnn_batch_norm` when `_select_batch_norm_backend` allows it (see
`cudnn_batch_norm_applies`). On meta the same call reaches `native_batch_norm`, which allocates
the same output and float save_mean / save_invstd of size C (the weight's dtype, as cuDNN's
save_mean / save_var), so only cuDNN's extras are missing
(aten/src/ATen/native/cudnn/BatchNorm.cpp):
  forward (training): output; workspace (ForwardTrainingExWorkspaceSize, freed on return);
                      reserve (TrainingExReserveSpaceSize, saved for backward with save_mean);
                      save_mean, save_var [C];
  backward:           grad_input, grad_weight, grad_bias, always all three (the meta kernel
                      also returns all three whatever output_mask says); workspace
                      (BackwardExWorkspaceSize, freed on return).
The cuDNN sizes need a GPU to query: they come from the stack profile
(`kernel_workspace_bytes.cudnn_batch_norm_*`, "assumed" until measured). The first cuDNN batch
norm also loads kernel images outside the caching allocator (`library_bytes.<gpu>.cudnn_batch_norm`).

Group norm (aten/src/ATen/native/cuda/group_norm_kernel.cu), after the outputs:
  forward, HxW > 1 with gamma or beta: a, b [N, C] in the accumulate type, freed on return;
  backward: ds, db [N, C]; with grad_input: c2, c3 [N, G] and then, with gamma (HxW > 1), c1
  [N, G, D] = [N, C] (the 1-d path, HxW == 1, makes no c1); all freed on return.
Layer norm (aten/src/ATen/native/cuda/layer_norm_kernel.cu, 2.4-2.6) allocates its outputs and,
when the input is not contiguous (ConvNeXt's channels-last `permute` before `LayerNorm`,
torchvision's and timm's `LayerNorm2d`), a contiguous copy of it:
  forward  (`layer_norm_cuda`): X = input.expect_contiguous() before Y, mean, rstd; freed on
           return (after the outputs);
  backward (`layer_norm_backward_cuda`): X = input.expect_contiguous() before dX, dgamma, dbeta;
           then `LayerNormBackwardKernelImpl` runs on dY.contiguous() (a copy when the incoming
           gradient is not contiguous, freed when the kernel returns); X freed on return.
The meta kernels make only the outputs, so both copies are recorded here.
"""

from __future__ import annotations

import weakref

import torch

from peakmem.cuda_rules.registry import RuleContext, register_op_rule

aten = torch.ops.aten

CUDNN_BN_MAX_BATCH_TRAINING = 880801
CUDNN_BN_MAX_BATCH_EVAL = 65535
INT32_MAX = 2**31 - 1


def _accumulate_bytes(dtype: torch.dtype) -> int:
    """acc_type<T, is_cuda=true>: float for half/bfloat16, else the type itself."""
    if dtype in (torch.float16, torch.bfloat16):
        return 4
    return torch.empty((), dtype=dtype, device="meta").element_size()


def cudnn_batch_norm_applies(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
) -> bool:
    """`_select_batch_norm_backend` (Normalization.cpp, torch 2.4) choosing cuDNN. The epsilon
    check is against CUDNN_BN_MIN_EPSILON, 0.0 since cuDNN 8, so it always holds."""
    if weight is None or bias is None or not torch.backends.cudnn.enabled:
        return False
    if torch.bfloat16 in (input.dtype, weight.dtype):
        return False
    if input.dtype == torch.float16 and weight.dtype != torch.float32:
        return False
    stats_defined = running_mean is not None and running_var is not None
    stats_absent = running_mean is None and running_var is None
    if not (stats_defined or (stats_absent and training)):
        return False
    if input.dim() < 3:
        return False
    limit = CUDNN_BN_MAX_BATCH_TRAINING if training else CUDNN_BN_MAX_BATCH_EVAL
    return input.shape[0] <= limit and input.numel() < INT32_MAX


_BN_SCHEMA = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")


@register_op_rule(aten.native_batch_norm)
def cudnn_batch_norm_forward(ctx: RuleContext, op, args: tuple, kwargs: dict):
    bound = dict(zip(_BN_SCHEMA, args, strict=False)) | kwargs
    training = bool(bound["training"])
    applies = training and cudnn_batch_norm_applies(
        bound["input"], bound["weight"], bound["bias"], bound["running_mean"],
        bound["running_var"], training,
    )
    if not applies:
        yield
        return
    ctx.load_library("cudnn_batch_norm")  # cuDNN's batch-norm kernels, loaded on first use
    stack = ctx.stack
    workspace = stack.kernel_workspace_bytes("cudnn_batch_norm_forward")
    reserve = stack.kernel_workspace_bytes("cudnn_batch_norm_reserve")
    # output first, then the workspace and the reserve, then save_mean / save_var: the
    # recorder makes all outputs at the yield; the workspace is live across them.
    workspace_id = ctx.scratch(workspace, category="workspace", op="cudnn_batch_norm[workspace]") if workspace else None
    reserve_id = ctx.scratch(reserve, category="temporary", op="cudnn_batch_norm[reserve]") if reserve else None
    out = yield
    if workspace_id is not None:
        ctx.release(workspace_id)
    if reserve_id is not None:
        save_mean = out[1] if isinstance(out, (tuple, list)) and len(out) > 1 else None
        if isinstance(save_mean, torch.Tensor):
            # saved for backward next to save_mean: freed when autograd drops the saved tensors
            weakref.finalize(save_mean.untyped_storage(), ctx.release, reserve_id)
        else:
            ctx.release(reserve_id)


_BN_BACKWARD_SCHEMA = (
    "grad_out", "input", "weight", "running_mean", "running_var", "save_mean", "save_invstd",
    "train", "eps", "output_mask",
)


@register_op_rule(aten.native_batch_norm_backward)
def cudnn_batch_norm_backward(ctx: RuleContext, op, args: tuple, kwargs: dict):
    bound = dict(zip(_BN_BACKWARD_SCHEMA, args, strict=False)) | kwargs
    train = bool(bound["train"])
    weight = bound["weight"]
    # the backward has no bias argument; cuDNN was chosen in forward only with a bias, which
    # nn.BatchNorm (affine) has whenever it has a weight
    if not (train and cudnn_batch_norm_applies(
        bound["input"], weight, weight, bound["running_mean"], bound["running_var"], train
    )):
        yield
        return
    ctx.load_library("cudnn_batch_norm")
    sizes = [
        bound["input"].numel() * bound["input"].element_size(),
        weight.numel() * weight.element_size(),
        weight.numel() * weight.element_size(),
    ]
    out = yield
    # cuDNN always writes grad_input, grad_weight and grad_bias; the meta kernel (torch 2.13)
    # returns all three too, whatever output_mask says. Any it left out is made here and freed
    # on return, as CUDA frees the gradients autograd does not want.
    outputs = list(out) if isinstance(out, (tuple, list)) else []
    name = "cudnn_batch_norm_backward[unused_grad]"
    dropped = [
        ctx.scratch(size, category="temporary", op=name)
        for index, size in enumerate(sizes)
        if index >= len(outputs) or not isinstance(outputs[index], torch.Tensor)
    ]
    workspace = ctx.stack.kernel_workspace_bytes("cudnn_batch_norm_backward")
    if workspace:
        ctx.transient(workspace, category="workspace", op="cudnn_batch_norm_backward[workspace]")
    for ident in reversed(dropped):
        ctx.release(ident)


_GN_SCHEMA = ("input", "weight", "bias", "N", "C", "HxW", "group", "eps")


@register_op_rule(aten.native_group_norm)
def group_norm_forward_scratch(ctx: RuleContext, op, args: tuple, kwargs: dict, out) -> None:
    bound = dict(zip(_GN_SCHEMA, args, strict=False)) | kwargs
    n, c, hxw = int(bound["N"]), int(bound["C"]), int(bound["HxW"])
    if n == 0 or hxw == 1 or (bound["weight"] is None and bound["bias"] is None):
        return
    nbytes = n * c * _accumulate_bytes(bound["input"].dtype)
    name = "native_group_norm[scratch]"
    a = ctx.scratch(nbytes, category="temporary", op=name)
    b = ctx.scratch(nbytes, category="temporary", op=name)
    ctx.release(b)
    ctx.release(a)


_GN_BACKWARD_SCHEMA = ("grad_out", "input", "mean", "rstd", "weight", "N", "C", "HxW", "group", "output_mask")


@register_op_rule(aten.native_group_norm_backward)
def group_norm_backward_scratch(ctx: RuleContext, op, args: tuple, kwargs: dict, out) -> None:
    bound = dict(zip(_GN_BACKWARD_SCHEMA, args, strict=False)) | kwargs
    n, c, hxw, g = (int(bound[k]) for k in ("N", "C", "HxW", "group"))
    if n == 0:
        return
    acc = _accumulate_bytes(bound["input"].dtype)
    name = "native_group_norm_backward[scratch]"
    idents = [ctx.scratch(n * c * acc, category="temporary", op=name) for _ in ("ds", "db")]
    if bool(bound["output_mask"][0]):
        idents += [ctx.scratch(n * g * acc, category="temporary", op=name) for _ in ("c2", "c3")]
        if hxw > 1 and bound["weight"] is not None:
            # c1 is made empty before c2/c3 and sized [N, G, D] by its TensorIterator after them
            idents.append(ctx.scratch(n * c * acc, category="temporary", op=name))
    for ident in reversed(idents):
        ctx.release(ident)


def _contiguous_copy_bytes(tensor: torch.Tensor | None) -> int:
    """Bytes `expect_contiguous()` / `contiguous()` allocates for `tensor`: 0 when it is already
    contiguous (a borrow), else a dense copy of its elements."""
    if tensor is None or tensor.numel() == 0 or tensor.is_contiguous():
        return 0
    return tensor.numel() * tensor.element_size()


@register_op_rule(aten.native_layer_norm)
def layer_norm_contiguous_input(ctx: RuleContext, op, args: tuple, kwargs: dict):
    """`layer_norm_cuda`: the contiguous copy of a non-contiguous input, live around the outputs."""
    nbytes = _contiguous_copy_bytes(args[0] if args else kwargs.get("input"))
    copy = ctx.scratch(nbytes, category="temporary", op="native_layer_norm[contiguous input]") if nbytes else None
    yield
    if copy is not None:
        ctx.release(copy)


@register_op_rule(aten.native_layer_norm_backward)
def layer_norm_backward_contiguous_copies(ctx: RuleContext, op, args: tuple, kwargs: dict):
    """`layer_norm_backward_cuda`: X = input.expect_contiguous() before the outputs, then
    dY.contiguous() inside the kernel call; dY's copy is freed first, X's on return."""
    names = ("grad_out", "input")
    bound = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    x_bytes = _contiguous_copy_bytes(bound.get("input"))
    x_copy = ctx.scratch(x_bytes, category="temporary", op="native_layer_norm_backward[contiguous input]") if x_bytes else None
    yield
    dy_bytes = _contiguous_copy_bytes(bound.get("grad_out"))
    if dy_bytes:
        ctx.transient(dy_bytes, category="temporary", op="native_layer_norm_backward[contiguous grad_out]")
    if x_copy is not None:
        ctx.release(x_copy)

"""Softmax kernels whose CUDA implementation allocates more than its output.

- `_safe_softmax` (the softmax of SDPA's math path since torch 2.5). Measured
  (benchmarks/snapshots/h200_t5_small_bf16_b8.digest.json.gz, torch 2.11, every one of the 12
  math-path self-attention calls of each step): right after the float32 softmax output (batch x
  heads x q x k x 4 B), the call allocates a boolean tensor the size of its input
  (`self.eq(-inf)`), one boolean per row (`all(masked, dim, keepdim=True)`) and a 0-dim tensor
  of the output's dtype (the `0.0` fill value), and frees them in the reverse order before it
  returns. The capture's CPU/meta `_safe_softmax` is one kernel that only allocates the output.
  Torch 2.4's math path called `softmax` (`_safe_softmax` came with 2.5, pytorch/pytorch#131060):
  for a stack older than 2.5 the call allocates its output only.
- `_softmax_backward_data`: CUDA's `softmax_backward_cuda_out` (aten/src/ATen/native/cuda/
  SoftMax.cu) computes `Tensor tmp = grad * output;` after the structured kernel's grad_input
  was allocated, and passes `tmp` to `host_softmax_backward`: one more tensor of the gradient's
  shape (dtype: grad's and output's promoted), freed when the kernel returns. Measured in the same
  digest: one more 64 MiB (8 x 8 x 512 x 512 float32) allocation right after each math-path
  softmax backward's output, freed before the node returns. (`_log_softmax_backward_data` has no
  such product.)
"""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import RuleContext, register_op_rule

aten = torch.ops.aten
_OP = "_safe_softmax[masked_rows]"
SAFE_SOFTMAX_SINCE = (2, 5)


@register_op_rule(aten._safe_softmax)
def safe_softmax(ctx: RuleContext, op, args: tuple, kwargs: dict):
    out = yield  # the softmax output comes first
    if tuple(ctx.stack.torch_min) < SAFE_SOFTMAX_SINCE:
        return
    self = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
    numel = self.numel()
    rows = numel // max(1, self.shape[dim]) if self.dim() else 1
    masked = ctx.scratch(numel, category="temporary", op=_OP)  # self.eq(-inf)
    masked_rows = ctx.scratch(rows, category="temporary", op=_OP)  # all(..., dim, keepdim)
    zero = ctx.scratch(out.element_size(), category="temporary", op=_OP)  # scalar_tensor(0.0)
    for ident in (zero, masked_rows, masked):
        ctx.release(ident)


@register_op_rule(aten._softmax_backward_data)
def softmax_backward_product(ctx: RuleContext, op, args: tuple, kwargs: dict, out) -> None:
    grad, output = args[0], args[1]
    dtype = torch.promote_types(grad.dtype, output.dtype)
    nbytes = grad.numel() * torch.empty((), dtype=dtype).element_size()
    ctx.transient(nbytes, category="temporary", op="_softmax_backward_data[grad*output]")

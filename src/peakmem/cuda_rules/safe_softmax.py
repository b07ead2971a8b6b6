"""`_safe_softmax` (the softmax of SDPA's math path since torch 2.5): the CUDA kernel allocates
more than its output.

Measured (benchmarks/snapshots/h200_t5_small_bf16_b8.digest.json.gz, torch 2.11, every one of
the 12 math-path self-attention calls of each step): right after the float32 softmax output
(batch x heads x q x k x 4 B), the call allocates a boolean tensor the size of its input
(`self.eq(-inf)`), one boolean per row (`all(masked, dim, keepdim=True)`) and a 0-dim tensor of
the output's dtype (the `0.0` fill value), and frees them in the reverse order before it returns.
The capture's CPU/meta `_safe_softmax` is one kernel that only allocates the output.
"""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import RuleContext, register_op_rule

aten = torch.ops.aten
_OP = "_safe_softmax[masked_rows]"


@register_op_rule(aten._safe_softmax)
def safe_softmax(ctx: RuleContext, op, args: tuple, kwargs: dict):
    out = yield  # the softmax output comes first
    self = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
    numel = self.numel()
    rows = numel // max(1, self.shape[dim]) if self.dim() else 1
    masked = ctx.scratch(numel, category="temporary", op=_OP)  # self.eq(-inf)
    masked_rows = ctx.scratch(rows, category="temporary", op=_OP)  # all(..., dim, keepdim)
    zero = ctx.scratch(out.element_size(), category="temporary", op=_OP)  # scalar_tensor(0.0)
    for ident in (zero, masked_rows, masked):
        ctx.release(ident)

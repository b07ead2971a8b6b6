"""Activation backwards that meta decomposes into several temporaries while CUDA runs one fused
kernel that only allocates the gradient (FACTS.md section 8: `mish_backward` was up to 15 GB
over when decomposed)."""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import register_fused_kernel


@register_fused_kernel(["mish_backward", "silu_backward"])
def fused_activation_backward(grad_output: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    """The CUDA kernel writes grad_input, shaped like the input, in one pass."""
    return torch.empty_like(self, dtype=grad_output.dtype)

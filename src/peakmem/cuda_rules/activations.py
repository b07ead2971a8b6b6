"""Activations whose meta path allocates more than the CUDA kernel.

- `mish_backward`, `silu_backward`: meta decomposes them (CompositeImplicitAutograd) into several
  temporaries while CUDA runs one fused kernel that only allocates the gradient (FACTS.md section
  8: `mish_backward` was up to 15 GB over when decomposed);
- `log_sigmoid_forward`: the meta kernel (like the CPU one) returns a `buffer` the size of the
  input, saved for backward; the CUDA kernel returns an empty buffer
  (aten/src/ATen/native/cuda/LogSigmoid.cu `log_sigmoid_forward_cuda`: `result =
  at::empty_like(input); buffer = at::empty({0}, input.options())`), and `log_sigmoid_backward`
  on CUDA ignores it.
"""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import register_fused_kernel


@register_fused_kernel(["mish_backward", "silu_backward"])
def fused_activation_backward(grad_output: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    """The CUDA kernel writes grad_input, shaped like the input, in one pass."""
    return torch.empty_like(self, dtype=grad_output.dtype)


@register_fused_kernel("log_sigmoid_forward")
def log_sigmoid_forward(self: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The output, and the empty buffer CUDA returns (no allocation)."""
    return torch.empty_like(self), self.new_empty((0,))

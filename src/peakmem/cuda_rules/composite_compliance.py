"""Composite ops whose ATen code takes an out-of-place branch for "tensor-subclass-like" inputs.

ATen's `isTensorSubclassLike` (aten/src/ATen/TensorSubclassLikeUtils.h) is true for every tensor
while a Python dispatch mode is active: under the capture's recorder, composite ops that choose an
in-place step for plain tensors take their composite-compliant, out-of-place branch instead, and
the trace gets a temporary the GPU run never allocates. Each rule here runs the plain-tensor
branch, as on the GPU.

- `linear` (aten/src/ATen/native/Linear.cpp, torch 2.4 to 2.13): with a bias, a 2-D input runs
  `addmm` and a contiguous n-D input the flattened `addmm`; any other input (a transposed or
  sliced activation: `nn.MultiheadAttention` with `batch_first=True` projects a transposed query)
  runs `matmul` and then `output.add_(bias)` in place, where the capture would add out of place:
  one extra output-sized temporary per call. Measured on an H100 (torch 2.11, GPUMemNet
  transformer rows of benchmarks/groundtruth/h100-80gb.csv): the extra 144 MiB temporary per
  in-projection changed which cached blocks later requests reused, and the simulated peak
  reserve by -520..+106 MiB.

Composite ops whose rule runs ATen's own decomposition mark it with `composite_branch`, so that
the capture can replay the in-place steps of that decomposition (capture/in_place_branches.py:
`_scaled_dot_product_attention_math`'s `attn.add_(attn_mask)`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from peakmem.cuda_rules.autocast import run_lower_precision
from peakmem.cuda_rules.registry import RuleContext, register_composite_rule


def linear_adds_bias_in_place(input: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ATen's `linear` ends in `matmul` + `add_` for plain tensors: a bias, an input of
    more than 2 dimensions that is not contiguous (contiguous ones are flattened into `addmm`),
    no forward-mode gradient on the bias, and no forced flattening (TORCH_LINEAR_FLATTEN_3D=1
    makes a 3-D input contiguous and flattens it)."""
    if bias is None or input.dim() <= 2 or input.is_contiguous():
        return False
    if input.dim() == 3 and _flatten_3d_forced():
        return False
    # forward-mode AD: ATen adds out of place when the bias carries a tangent
    return getattr(torch.autograd.forward_ad, "_current_level", -1) < 0


def _flatten_3d_forced() -> bool:
    return os.environ.get("TORCH_LINEAR_FLATTEN_3D") == "1"


@register_composite_rule("linear")
def linear(ctx: RuleContext, op, input: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """Cast as CUDA autocast casts `linear` (a lower-precision op), then ATen's branch."""

    def call(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if not linear_adds_bias_in_place(input, bias):
            return op.decompose(input, weight, bias)
        output = torch.matmul(input, weight.t())
        output.add_(bias)
        return output

    return run_lower_precision(ctx, call, (input, weight, bias), {})


SDPA_MATH = "scaled_dot_product_attention[math]"
"""`scaled_dot_product_attention` decomposed into `_scaled_dot_product_attention_math`."""

_local = threading.local()


def _composites() -> list[str]:
    stack = getattr(_local, "composites", None)
    if stack is None:
        stack = _local.composites = []
    return stack


@contextmanager
def composite_branch(where: str) -> Iterator[None]:
    """Mark that a composite op's ATen decomposition runs here (`where`, e.g. `SDPA_MATH`), for
    the in-place steps registered under that name in capture/in_place_branches.py."""
    stack = _composites()
    stack.append(where)
    try:
        yield
    finally:
        stack.pop()


def active_composite() -> str | None:
    """The innermost composite decomposition marked by `composite_branch` on this thread."""
    stack = _composites()
    return stack[-1] if stack else None

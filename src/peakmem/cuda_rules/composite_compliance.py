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

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from peakmem.cuda_rules.autocast import run_lower_precision
from peakmem.cuda_rules.environment import environment_value
from peakmem.cuda_rules.registry import RuleContext, register_composite_rule


def _not_forced() -> bool:
    return False


def linear_branch(input: torch.Tensor, bias: torch.Tensor | None,
                  flatten_3d: Callable[[], bool] = _not_forced) -> str:
    """Which branch ATen's `linear` takes for plain tensors (Linear.cpp, torch 2.4 to 2.13):
    "addmm" (no bias, or a 2-D input: nothing to replay), "flatten" (a contiguous 3-D input, or a
    contiguous strided one with a 1-D bias: the flattened `addmm`), "flatten_copy"
    (TORCH_LINEAR_FLATTEN_3D=1 and a non-contiguous 3-D input: `input.contiguous()`, then the
    flattened `addmm`), "add_in_place" (`matmul`, then `output.add_(bias)`), "add_out_of_place"
    (the same with a forward-mode tangent: ATen adds out of place). `flatten_3d()` is asked
    exactly where ATen reaches `parseLinearFlatten3d()`, which reads the variable the first time
    (a rule passes `linear_flatten_3d(ctx)`; the default: not forced)."""
    if bias is None or input.dim() == 2:
        return "addmm"
    contiguous = input.is_contiguous()
    if contiguous and (input.dim() == 3 or (input.layout == torch.strided and bias.dim() == 1)):
        return "flatten"
    if flatten_3d() and input.dim() == 3:
        return "flatten_copy"
    if getattr(torch.autograd.forward_ad, "_current_level", -1) >= 0:
        return "add_out_of_place"
    return "add_in_place"


def linear_adds_bias_in_place(input: torch.Tensor, bias: torch.Tensor | None,
                              flatten_3d: Callable[[], bool] = _not_forced) -> bool:
    """Whether ATen's `linear` ends in `matmul` + `add_` for plain tensors (`linear_branch`): a
    bias, an input that is not 2-D and not contiguous (contiguous ones are flattened into
    `addmm`), no forward-mode gradient on the bias, and no forced flattening
    (TORCH_LINEAR_FLATTEN_3D=1 makes a 3-D input contiguous and flattens it)."""
    return linear_branch(input, bias, flatten_3d) == "add_in_place"


def linear_flatten_3d(ctx: RuleContext) -> Callable[[], bool]:
    """TORCH_LINEAR_FLATTEN_3D=1 as ATen's `parseLinearFlatten3d` holds it: the job's value at the
    first call that reaches it (Linear.cpp: `static int value = -1`)."""
    return lambda: environment_value(ctx, "TORCH_LINEAR_FLATTEN_3D") == "1"


@register_composite_rule("linear")
def linear(ctx: RuleContext, op, input: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """Cast as CUDA autocast casts `linear` (a lower-precision op), then ATen's branch."""

    def call(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        branch = linear_branch(input, bias, linear_flatten_3d(ctx))
        if branch == "flatten_copy":  # ATen's contiguous 3-D branch (not this process's static)
            return op.decompose(input.contiguous(), weight, bias)
        if branch != "add_in_place":
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

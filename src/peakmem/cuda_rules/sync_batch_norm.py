"""SyncBatchNorm's CUDA-only kernels, which have no meta kernel in torch (a fake-mode job with
`nn.SyncBatchNorm` over more than one process raised NotImplementedError at
`torch.batch_norm_stats`).

`torch.nn.modules._functions.SyncBatchNorm` (world size > 1, training) runs, per layer:
  forward:  `batch_norm_stats` -> mean, invstd; all_gather of (mean, invstd, count);
            `batch_norm_gather_stats_with_counts` -> global mean, invstd (and the running
            statistics updated in place); `batch_norm_elemt` -> the output;
  backward: `batch_norm_backward_reduce` -> sum_dy, sum_dy_xmu, grad_weight, grad_bias;
            all_reduce of (sum_dy, sum_dy_xmu); `batch_norm_backward_elemt` -> grad_input.
What each CUDA kernel allocates (aten/src/ATen/native/cuda/Normalization.cu and
Normalization.cuh, torch 2.4-2.13), all of it returned (no scratch the caching allocator sees
beyond the channels-last reductions' small staging buffers, left out):
  batch_norm_stats:            save_mean, save_invstd [C] in the input's accumulate type
                               (float for half / bfloat16);
  batch_norm_gather_stats(_with_counts): save_mean, save_invstd [C] like the gathered `mean`;
  batch_norm_update_stats:     save_mean, save_var [C] in the accumulate type;
  batch_norm_elemt:            output `empty_like(input, input.suggest_memory_format())`;
  batch_norm_backward_reduce:  sum_dy, sum_dy_xmu `empty_like(mean)` when input_g;
                               grad_weight, grad_bias [C] of the weight's dtype when
                               weight_g / bias_g (undefined otherwise: None in Python);
  batch_norm_backward_elemt:   grad_input `empty_like(input, input.suggest_memory_format())`.
"""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import register_fused_kernel

_ACCUMULATE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _accumulate(dtype: torch.dtype) -> torch.dtype:
    """acc_type<T, is_cuda=true> for the floating types these kernels dispatch over."""
    return _ACCUMULATE.get(dtype, dtype)


def _suggested_layout(input: torch.Tensor) -> torch.memory_format:
    """`TensorBase::suggest_memory_format()`: channels-last when the strides say so."""
    if input.dim() == 4 and not input.is_contiguous() and input.is_contiguous(
            memory_format=torch.channels_last):
        return torch.channels_last
    if input.dim() == 5 and not input.is_contiguous() and input.is_contiguous(
            memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


def _like_input(input: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(input, memory_format=_suggested_layout(input))


def _per_channel(input: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return input.new_empty((input.shape[1],), dtype=dtype)


@register_fused_kernel("batch_norm_stats")
def batch_norm_stats(input: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = _accumulate(input.dtype)
    return _per_channel(input, dtype), _per_channel(input, dtype)


@register_fused_kernel("batch_norm_update_stats")
def batch_norm_update_stats(input: torch.Tensor, running_mean: torch.Tensor | None,
                            running_var: torch.Tensor | None,
                            momentum: float) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = _accumulate(input.dtype)
    return _per_channel(input, dtype), _per_channel(input, dtype)


def _gathered(mean: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    features = mean.shape[-1]
    return mean.new_empty((features,)), mean.new_empty((features,))


@register_fused_kernel("batch_norm_gather_stats_with_counts")
def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var,
                                        momentum, eps, counts):
    return _gathered(mean)


@register_fused_kernel("batch_norm_gather_stats")
def batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, momentum, eps,
                            count):
    return _gathered(mean)


@register_fused_kernel("batch_norm_elemt")
def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    return _like_input(input)


@register_fused_kernel("batch_norm_backward_reduce")
def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g,
                               bias_g):
    sum_dy = sum_dy_xmu = grad_weight = grad_bias = None
    if input_g:
        sum_dy = torch.empty_like(mean, memory_format=torch.contiguous_format)
        sum_dy_xmu = torch.empty_like(mean, memory_format=torch.contiguous_format)
    if weight_g:
        grad_weight = weight.new_empty((input.shape[1],))
    if bias_g:
        grad_bias = weight.new_empty((input.shape[1],))
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


@register_fused_kernel("batch_norm_backward_elemt")
def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    return _like_input(input)

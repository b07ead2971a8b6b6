"""`scaled_dot_product_attention` on CUDA picks a fused backend by GPU architecture, dtype, head
size and mask (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; priority flash >
memory-efficient > math). The fused backends save the output and a logsumexp for backward
instead of the math path's full attention matrix; memory-efficient pads the logsumexp's sequence
dimension to a multiple of 32 (its meta kernel does the same).
cuDNN attention is not chosen here: its priority changed between releases (not modelled yet)."""

from __future__ import annotations

from enum import StrEnum

import torch
import torch.nn.functional as F

from peakmem.cuda_rules.autocast import run_lower_precision
from peakmem.cuda_rules.registry import (
    RuleContext,
    register_composite_rule,
    register_fused_kernel,
    register_host_outputs,
)

aten = torch.ops.aten


class SdpaBackend(StrEnum):
    FLASH = "flash"
    EFFICIENT = "efficient"
    MATH = "math"


def _flash_ok(capability: tuple[int, int], q, k, v, attn_mask, is_causal=False) -> bool:
    if not torch.backends.cuda.flash_sdp_enabled() or attn_mask is not None:
        return False
    if capability < (8, 0) or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim or head_dim > 256:
        return False
    if is_causal and q.shape[-2] != k.shape[-2]:
        return False  # check_flash_causal_non_square_seqlens
    needs_grad = any(t.requires_grad for t in (q, k, v))
    if needs_grad and head_dim > 192 and capability in ((8, 6), (8, 9)):
        return False  # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89
    # grouped-query attention (fewer key/value heads) is supported by flash only
    return q.shape[-3] % k.shape[-3] == 0 and k.shape[-3] == v.shape[-3]


def _efficient_ok(capability: tuple[int, int], q, k, v, attn_mask) -> bool:
    if not torch.backends.cuda.mem_efficient_sdp_enabled() or capability < (5, 0):
        return False
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    if q.dtype == torch.bfloat16 and capability < (8, 0):
        return False
    alignment = 4 if q.dtype == torch.float32 else 8  # 16-byte aligned head dims
    same_heads = q.shape[-3] == k.shape[-3] == v.shape[-3]
    return same_heads and q.shape[-1] % alignment == 0 and v.shape[-1] % alignment == 0


def choose_backend(
    capability: tuple[int, int], q, k, v, attn_mask, is_causal: bool = False
) -> SdpaBackend:
    """The backend CUDA would pick for these inputs (4-D, no nested tensors)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return SdpaBackend.MATH
    if _flash_ok(capability, q, k, v, attn_mask, is_causal):
        return SdpaBackend.FLASH
    if _efficient_ok(capability, q, k, v, attn_mask):
        return SdpaBackend.EFFICIENT
    return SdpaBackend.MATH


def _attn_bias(attn_mask, q):
    """Memory-efficient attention takes an additive bias: boolean masks are converted
    (a new tensor), and a last dimension not a multiple of 16 is padded (another one)."""
    if attn_mask is None:
        return None
    bias = attn_mask
    if bias.dtype == torch.bool:
        bias = torch.where(bias.logical_not(), float("-inf"), 0.0).to(q.dtype)
    last = bias.shape[-1]
    if last % 16:
        padded = F.pad(bias, (0, 16 - last % 16))
        bias = padded[..., :last]
    return bias


@register_composite_rule("scaled_dot_product_attention")
def scaled_dot_product_attention(
    ctx: RuleContext,
    op,
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
):
    """Autocast (a lower-precision op), then the backend CUDA would pick."""

    def attend(q, k, v, mask):
        if not enable_gqa and q.dim() == 4 and q.shape[-3] != k.shape[-3]:
            backend = SdpaBackend.MATH  # mismatched heads without enable_gqa: an error on CUDA
        else:
            backend = choose_backend(ctx.gpu.capability, q, k, v, mask, is_causal)
        if backend is SdpaBackend.FLASH:
            return aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale
            )[0]
        if backend is SdpaBackend.EFFICIENT:
            needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            return aten._scaled_dot_product_efficient_attention(
                q, k, v, _attn_bias(mask, q), needs_grad, dropout_p, is_causal, scale=scale
            )[0]
        return op.decompose(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    return run_lower_precision(ctx, attend, (query, key, value, attn_mask), {})


@register_host_outputs(aten._scaled_dot_product_efficient_attention)
def efficient_attention_host_outputs(out):
    """The philox seed and offset are host scalars on CUDA."""
    return out[2:4]


@register_host_outputs(aten._scaled_dot_product_flash_attention)
def flash_attention_host_outputs(out):
    """cum_seq_q/k are empty for dense inputs; rng_state stays a (tiny) device tensor."""
    return [t for t in out[2:4] if isinstance(t, torch.Tensor)]


def _views_of_one_buffer(query, key, value) -> bool:
    storage = query.untyped_storage()
    return key.untyped_storage() is storage and value.untyped_storage() is storage


@register_fused_kernel("_scaled_dot_product_efficient_attention_backward")
def efficient_attention_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    out,
    logsumexp,
    philox_seed,
    philox_offset,
    dropout_p,
    grad_input_mask,
    is_causal=False,
    scale=None,
):
    """When q, k and v are views of one buffer (a packed in-projection, as in
    nn.MultiheadAttention), the CUDA backward writes their gradients into ONE buffer
    [B, M, 3, H, K] (attention_backward.cu: `chunk_grad_outputs`); otherwise three, in the
    kernel's [B, M, H, K] layout. The stock meta kernel always makes three."""
    batch, heads, max_q, head_dim = query.shape
    max_k, head_dim_v = key.shape[2], value.shape[3]
    grad_kv_needs_init = is_causal and max_k > max_q
    if (
        not grad_kv_needs_init
        and max_q == max_k
        and head_dim == head_dim_v
        and key.shape[1] == heads
        and _views_of_one_buffer(query, key, value)
    ):
        grad_qkv = torch.empty(
            (batch, max_q, 3, heads, head_dim), dtype=query.dtype, device=query.device
        )
        grad_q, grad_k, grad_v = (grad_qkv.select(2, i).transpose(1, 2) for i in range(3))
    else:
        grad_q, grad_k, grad_v = (
            torch.empty_permuted(
                (batch, heads, length, dim), (0, 2, 1, 3), dtype=t.dtype, device=t.device
            )
            for t, length, dim in ((query, max_q, head_dim), (key, max_k, head_dim), (value, max_k, head_dim_v))
        )
    grad_bias = None
    if attn_bias is not None and grad_input_mask[3]:
        last = attn_bias.shape[-1]
        aligned = last if last % 16 == 0 else last + 16 - last % 16
        grad_bias = torch.empty(
            (*attn_bias.shape[:-1], aligned), dtype=attn_bias.dtype, device=attn_bias.device
        )[..., :last]
    return grad_q, grad_k, grad_v, grad_bias

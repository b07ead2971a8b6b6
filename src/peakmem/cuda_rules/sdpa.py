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
from peakmem.cuda_rules.composite_compliance import SDPA_MATH, composite_branch
from peakmem.cuda_rules.registry import (
    RuleContext,
    register_composite_rule,
    register_host_outputs,
    register_op_rule,
)

aten = torch.ops.aten


class SdpaBackend(StrEnum):
    FLASH = "flash"
    EFFICIENT = "efficient"
    MATH = "math"


def _last_dims_unit_stride(q, k, v, attn_mask, ignore_singleton_dim: bool) -> bool:
    """sdp_utils_cpp.h `check_last_dim_stride_equals_1_dense`: every fused CUDA backend needs
    stride 1 in the last dimension of query, key, value and (on the GPU, not the CPU) of the
    mask; flash lets a head dim of 1 pass. Otherwise CUDA runs the math path. (A relative
    position bias permuted from (q, k, heads), e.g. T5's `compute_bias`, has the heads' stride
    there: transformers <= 5.17 passed it to SDPA as is.)"""
    qkv_ok = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if ignore_singleton_dim:
        qkv_ok = qkv_ok or q.shape[-1] == 1
    return qkv_ok and (attn_mask is None or attn_mask.stride(-1) == 1)


def _flash_ok(capability: tuple[int, int], q, k, v, attn_mask, is_causal=False) -> bool:
    if not torch.backends.cuda.flash_sdp_enabled() or attn_mask is not None:
        return False
    if not _last_dims_unit_stride(q, k, v, None, ignore_singleton_dim=True):
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
    if not _last_dims_unit_stride(q, k, v, attn_mask, ignore_singleton_dim=False):
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
        with composite_branch(SDPA_MATH):  # attn.add_(mask) on CUDA (capture/in_place_branches.py)
            return op.decompose(q, k, v, mask, dropout_p, is_causal, scale=scale,
                                enable_gqa=enable_gqa)

    return run_lower_precision(ctx, attend, (query, key, value, attn_mask), {})


@register_host_outputs(aten._scaled_dot_product_efficient_attention)
def efficient_attention_host_outputs(out):
    """The philox seed and offset are host scalars on CUDA."""
    return out[2:4]


@register_host_outputs(aten._scaled_dot_product_flash_attention)
def flash_attention_host_outputs(out):
    """cum_seq_q/k are empty for dense inputs; rng_state stays a (tiny) device tensor."""
    return [t for t in out[2:4] if isinstance(t, torch.Tensor)]



# Backward kernels of memory-efficient attention for fp32 on sm80-sm99, in dispatch order
# (mem_eff_attention/kernels/cutlassB.h, `dispatch_cutlassB_f32_sm80`): (kBlockSizeI,
# kBlockSizeJ, kMaxK). The dropout and no-dropout lists have the same shapes. The launcher takes
# the first one with kMaxK >= max(head dims) whose shared memory fits the device.
_F32_SM80_BACKWARD_KERNELS = (
    (64, 64, 32),
    (64, 64, 64),
    (128, 64, 128),
    (64, 64, 128),
    (128, 64, 65536),
    (64, 64, 65536),
)
# Parts with the large shared memory (A100: 163 KiB, H100: 227 KiB per block) run the 128-row
# kernels; the sm86/sm89 parts (99 KiB) fall back to 64 rows. Assumed from the generator's
# comment (generate_kernels.py: "Some architectures have more shmem and can use 128"), not
# computed from sizeof(SharedStorage); for the fp32 workspace the choice only moves the 16-byte
# per-tile headers (a few KiB).
_BIG_SHARED_MEMORY = ((8, 0), (9, 0))


def efficient_backward_blocks(capability: tuple[int, int], dtype, max_k: int):
    """(kBlockSizeI, kBlockSizeJ) of the memory-efficient backward kernel CUDA launches, or None
    where it is not modelled (half precision, other architectures)."""
    if dtype != torch.float32 or not (8, 0) <= capability < (10, 0):
        return None
    for block_i, block_j, kernel_max_k in _F32_SM80_BACKWARD_KERNELS:
        if kernel_max_k < max_k or (block_i == 128 and capability not in _BIG_SHARED_MEMORY):
            continue
        return block_i, block_j
    return None


def efficient_backward_workspace_bytes(
    capability: tuple[int, int], dtype, batch: int, heads: int, queries: int, head_dim: int,
    head_dim_value: int,
) -> int:
    """Bytes of the gmem workspace the memory-efficient backward allocates with `at::empty`
    (attention_backward.cu `_efficient_attention_backward`: `workspace = at::empty({size_bytes},
    kByte)` where `size_bytes = p.workspace_size()`), kernel_backward.h `Params`:

        workspace_size = num_batches * num_heads * workspace_strideBH * sizeof(float)
        workspace_strideBH = align_up(gk + gv + gq elements, 4)
        gq = ceil(num_queries / kBlockSizeI) * ceil(head_dim / kBlockSizeJ)
             * sizeof(GradQTempStorage) / sizeof(float)
        GradQTempStorage = {int32 lock, counter, pad[2]; float buffer[kBlockSizeI * kBlockSizeJ]}

    (MatmulGradQ::ThreadblockShape::kN is kBlockSizeJ; GmemTile::kElementsStored is kNumThreads
    * FragmentC::kElements, the whole kBlockSizeI x kBlockSizeJ accumulator tile.) The gq part
    exists because split-keys is enabled (kNeedsAccumGradQ = kEnableSplitKeys || ...); gk and gv
    are only needed when the output type differs from the fp32 accumulator, so not for fp32,
    whatever num_splits_key is. The workspace is zeroed in place when keys are split (no
    allocation)."""
    blocks = efficient_backward_blocks(capability, dtype, max(head_dim, head_dim_value))
    if blocks is None:
        return 0
    block_i, block_j = blocks
    tiles = -(-queries // block_i) * -(-head_dim // block_j)
    grad_q_elements = tiles * (4 * 4 + 4 * block_i * block_j) // 4
    stride_bh = -(-grad_q_elements // 4) * 4
    return batch * heads * stride_bh * 4


@register_op_rule(aten._scaled_dot_product_efficient_attention_backward)
def efficient_attention_backward_scratch(ctx: RuleContext, op, args: tuple, kwargs: dict):
    """Scratch of the CUDA backward (attention_backward.cu, `_efficient_attention_backward`):

    - before the gradients: `grad_out.contiguous()` in the kernel's [B, M, H, K] layout, a copy
      when the incoming gradient is laid out otherwise (e.g. from nn.MultiheadAttention's
      permute), alive until the op returns;
    - after them: `delta` [B, H, M] in fp32. Kernels for half/bf16 compute it themselves (an
      empty buffer); otherwise it is `(grad_out.float() * out.float()).sum(-1).transpose(-2,
      -1).contiguous()`, whose temporaries die at the end of that statement;
    - then the kernel's gmem workspace (`efficient_backward_workspace_bytes`), held in a tensor
      declared at function scope: freed when the op returns, after `delta` (a lambda local).
    The workspace is modelled for fp32 on sm80-sm99 only."""
    grad_out, query, value = args[0], args[1], args[3]
    batch, heads, length = query.shape[0], query.shape[1], query.shape[2]
    per_row = batch * heads * length * 4
    full = per_row * value.shape[-1]
    half = query.dtype in (torch.float16, torch.bfloat16)
    op_name = "efficient_attention_backward[scratch]"

    def scratch(nbytes: int) -> int:
        return ctx.scratch(nbytes, category="temporary", op=op_name)

    grad_out_copy = None
    if not grad_out.transpose(1, 2).is_contiguous():
        grad_out_copy = scratch(grad_out.numel() * grad_out.element_size())

    yield  # grad_q, grad_k, grad_v (the op's outputs)

    if half and ctx.gpu.capability != (7, 0):
        delta = scratch(per_row)
    else:
        casts = [scratch(full), scratch(full)] if half else []  # grad_out.float(), out.float()
        product, summed = scratch(full), scratch(per_row)
        delta = scratch(per_row)
        for ident in (summed, product, *reversed(casts)):
            ctx.release(ident)
    workspace_bytes = efficient_backward_workspace_bytes(
        ctx.gpu.capability, query.dtype, batch, heads, length, query.shape[-1], value.shape[-1]
    )
    workspace = None
    if workspace_bytes:
        workspace = ctx.scratch(
            workspace_bytes, category="workspace", op="efficient_attention_backward[workspace]"
        )
    ctx.release(delta)
    if workspace is not None:
        ctx.release(workspace)
    if grad_out_copy is not None:
        ctx.release(grad_out_copy)

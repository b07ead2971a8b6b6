"""`scaled_dot_product_attention` on CUDA picks a fused backend by GPU architecture, dtype, head
size, mask and torch release (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
`select_sdp_backend`: the first backend of `priority_order` whose `can_use_*` accepts the call).
The default order is flash > memory-efficient > math > cuDNN (cuDNN after math: never chosen);
releases that prefer cuDNN attention on some GPUs put it first (`CUDNN_FIRST`, by release). The
fused backends save the output and a logsumexp for backward instead of the math path's full
attention matrix; memory-efficient pads the logsumexp's sequence dimension to a multiple of 32
(its meta kernel does the same), cuDNN keeps it as (B, H, L, 1) float32."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.nn.functional as F

from peakmem.cuda_rules import size_checks
from peakmem.cuda_rules.autocast import run_lower_precision
from peakmem.cuda_rules.composite_compliance import SDPA_MATH, composite_branch
from peakmem.cuda_rules.environment import environment_value, value_outside_a_capture
from peakmem.cuda_rules.registry import (
    RuleContext,
    register_composite_rule,
    register_host_outputs,
    register_op_rule,
)
from peakmem.release_numbers import leading_numbers

aten = torch.ops.aten


class SdpaBackend(StrEnum):
    FLASH = "flash"
    EFFICIENT = "efficient"
    MATH = "math"
    CUDNN = "cudnn"


DEFAULT_ORDER = (SdpaBackend.FLASH, SdpaBackend.EFFICIENT, SdpaBackend.MATH, SdpaBackend.CUDNN)
"""at::Context's default `sdp_priority_order` (torch._C._get_sdp_priority_order() == [1, 2, 0, 3,
4]: flash, efficient, math, cudnn, overrideable)."""
CUDNN_ORDER = (SdpaBackend.CUDNN, SdpaBackend.FLASH, SdpaBackend.EFFICIENT, SdpaBackend.MATH)
"""`priority_order`'s `cudnn_order` where `check_prefer_cudnn_attention()` holds."""


@dataclass(frozen=True)
class CudnnPreference:
    """From torch release `since` (major, minor, patch) on, cuDNN attention comes first on the GPUs
    for which `prefers(capability)` holds (`check_prefer_cudnn_attention`), until the next entry."""

    since: tuple[int, int, int]
    prefers: Callable[[tuple[int, int]], bool]
    source: str
    opt_out: tuple[str, str] | None = None
    """(variable, value): the environment setting that turns the preference off (c10
    `check_env`: "0" is false, "1" true)."""


def _never(capability: tuple[int, int]) -> bool:
    return False


CUDNN_FIRST: tuple[CudnnPreference, ...] = (
    CudnnPreference((2, 4, 0), _never, "2.4: cuDNN after math; #125343 (cuDNN first on H100) was "
                    "reverted on release/2.4 (#128539)"),
    CudnnPreference((2, 5, 0), lambda cap: cap[0] >= 9, "2.5.0: check_prefer_cudnn_attention: "
                    "CUDNN_VERSION >= 9.0 and major >= 9"),
    CudnnPreference((2, 5, 1), _never, "#138522 'Make CuDNN Attention Opt in' (cherry-picked to "
                    "release/2.5): priority_order returns the default order again"),
    CudnnPreference((2, 9, 0), lambda cap: cap in ((9, 0), (10, 0)), "#162073 (for 2.9): "
                    "CUDNN_VERSION >= 9.9, sm 9.0 / 10.0", ("TORCH_CUDNN_SDPA_PREFERRED", "0")),
    CudnnPreference((2, 10, 0), _never, "2.10: runtime cuDNN > 9.15.0 and sm 9.0 / 10.0 / 10.3 "
                    "(#169849, #171627); the cuDNN its wheels bundle is older"),
    CudnnPreference((2, 11, 0), lambda cap: cap in ((9, 0), (10, 0), (10, 3)), "2.11: the same "
                    "check; the wheels bundle cuDNN 9.19 (measured: benchmarks/groundtruth/"
                    "h200_versions.json, h200_parallel_leases/t5_sdpa_choice.txt)",
                    ("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")),
)

def parse_release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a torch version string ("2.11.0+cu130", "2.5", "2.5.1")."""
    numbers = leading_numbers(version)
    if len(numbers) < 2:
        raise ValueError(f"not a torch version: {version!r}")
    return numbers[0], numbers[1], numbers[2] if len(numbers) > 2 else 0


def priority_order(release: tuple[int, int, int] | None, capability: tuple[int, int],
                   environ: Callable[[str], str | None] = value_outside_a_capture):
    """The backends in the order `select_sdp_backend` tries them (None: the default order).
    `environ(name)`: the opt-out variable's value as torch holds it (a rule passes
    `environment_value`'s reading: torch reads it once, at the first backend choice)."""
    chosen = None
    for entry in CUDNN_FIRST:
        if release is not None and entry.since <= release:
            chosen = entry
    if chosen is None or not chosen.prefers(capability):
        return DEFAULT_ORDER
    if chosen.opt_out is not None and environ(chosen.opt_out[0]) == chosen.opt_out[1]:
        return DEFAULT_ORDER
    return CUDNN_ORDER


def target_release(ctx: RuleContext) -> tuple[int, int, int]:
    """The torch release the capture simulates: the version the estimate was asked for, else the
    stack profile's first release."""
    from peakmem.capture.fake_memory import target_settings

    _, version = target_settings("{}.{}".format(*ctx.stack.torch_min))
    return parse_release(version)


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


def _mask_shape_ok(q, k, attn_mask) -> bool:
    """sdp_utils_cpp.h `check_attn_mask_shape` (cuDNN only): no gradient for the mask (cuDNN
    computes no dBias), its last two sizes the queries' and keys' or 1, and 2-D or 4-D with batch
    and heads each the query's or 1."""
    if attn_mask is None:
        return True
    if attn_mask.requires_grad:
        return False
    if attn_mask.shape[-2] not in (q.shape[-2], 1) or attn_mask.shape[-1] not in (k.shape[-2], 1):
        return False
    if attn_mask.dim() == 2:
        return True
    return attn_mask.dim() == 4 and attn_mask.shape[0] in (1, q.shape[0]) and \
        attn_mask.shape[1] in (1, q.shape[1])


CUDNN_SDPA_VERSION = 91900
"""The runtime cuDNN the head-size limits below are read for (torch 2.11 wheels: 9.19). Releases
that do not put cuDNN first reach it only after math, i.e. with math disabled."""


def _cudnn_head_dim_limit(capability: tuple[int, int], d_qk: int, d_v: int) -> int:
    """`check_cudnn_tensor_shapes`: 128; 256 on sm 9.0 from cuDNN 9.10 (#161210, 2.9); (192, 128)
    on sm 10.x from cuDNN 9.11 (DeepSeek's head sizes, #172621). Later releases tie 256 to cuDNN
    > 9.22 and check the backward's head sizes apart (not modelled)."""
    if CUDNN_SDPA_VERSION >= 91000 and capability == (9, 0):
        return 256
    if CUDNN_SDPA_VERSION >= 91100 and capability[0] == 10 and (d_qk, d_v) == (192, 128):
        return 192
    return 128


def _cudnn_ok(capability: tuple[int, int], q, k, v, attn_mask, dropout_p: float) -> bool:
    """sdp_utils.cpp `can_use_cudnn_attention` for dense 4-D inputs (torch 2.10/2.11)."""
    if not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    if torch.are_deterministic_algorithms_enabled() and \
            not torch.is_deterministic_algorithms_warn_only_enabled():
        return False  # check_cudnn_deterministic
    if not (8, 0) <= capability <= (12, 1):
        return False  # check_cudnn_hardware_support
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False  # check_dtypes_low_precision
    if not _mask_shape_ok(q, k, attn_mask):
        return False
    if min(q.shape[-2], k.shape[-2]) == 0:
        return False  # check_nonzero_sequence_lengths_dense
    if not _last_dims_unit_stride(q, k, v, attn_mask, ignore_singleton_dim=True):
        return False
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        return False
    if q.shape[-3] % k.shape[-3] or k.shape[-3] != v.shape[-3]:
        return False  # check_batch_size_and_num_heads_dense<gqa, not same heads>
    s_q, s_k, d_qk, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    limit = _cudnn_head_dim_limit(capability, d_qk, d_v)
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False  # check_cudnn_tensor_shapes
    return s_k != 1 and not (s_q == 1 and dropout_p != 0.0)


def choose_backend(
    capability: tuple[int, int], q, k, v, attn_mask, is_causal: bool = False, *,
    dropout_p: float = 0.0, release: tuple[int, int, int] | None = None,
    environ: Callable[[str], str | None] = value_outside_a_capture,
) -> SdpaBackend:
    """The backend CUDA would pick for these inputs (4-D, no nested tensors) in torch `release`
    (None: a release with the default order); `environ` as for `priority_order`."""
    order = priority_order(release, capability, environ)  # first: it reads the opt-out variable
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return SdpaBackend.MATH
    accepts = {
        SdpaBackend.CUDNN: lambda: _cudnn_ok(capability, q, k, v, attn_mask, dropout_p),
        SdpaBackend.FLASH: lambda: _flash_ok(capability, q, k, v, attn_mask, is_causal),
        SdpaBackend.EFFICIENT: lambda: _efficient_ok(capability, q, k, v, attn_mask),
        SdpaBackend.MATH: lambda: True,
    }
    for backend in order:
        if accepts[backend]():
            return backend
    return SdpaBackend.MATH


def _float_mask(attn_mask, q):
    """attention.cpp `convert_boolean_attn_mask`: a boolean mask becomes an additive one in the
    query's dtype (a new tensor); other masks pass as they are."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    return torch.where(attn_mask.logical_not(), float("-inf"), 0.0).to(q.dtype)


def _attn_bias(attn_mask, q):
    """Memory-efficient attention takes an additive bias: boolean masks are converted
    (a new tensor), and a last dimension not a multiple of 16 is padded (another one)."""
    bias = _float_mask(attn_mask, q)
    if bias is None:
        return None
    last = bias.shape[-1]
    padded, width = size_checks.ask(bias_padding, last)
    if padded:
        bias = F.pad(bias, (0, width - last))[..., :last]
    return bias


def bias_padding(last: int) -> tuple[bool, int]:
    """(whether memory-efficient attention pads a bias's last dimension of size `last`, the
    padded size): to a multiple of 16 (a step in a sequence length: size_checks)."""
    return last % 16 != 0, -(-last // 16) * 16


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
        # select_sdp_backend runs for every call: its priority_order reads the opt-out variable
        # at the first one (cuda_rules/environment.py), whatever the inputs
        backend = choose_backend(ctx.gpu.capability, q, k, v, mask, is_causal,
                                 dropout_p=dropout_p, release=target_release(ctx),
                                 environ=lambda name: environment_value(ctx, name))
        if not enable_gqa and q.dim() == 4 and q.shape[-3] != k.shape[-3]:
            backend = SdpaBackend.MATH  # mismatched heads without enable_gqa: an error on CUDA
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        if backend is SdpaBackend.CUDNN:
            return aten._scaled_dot_product_cudnn_attention(
                q, k, v, _float_mask(mask, q), needs_grad, dropout_p, is_causal, False, scale=scale
            )[0]
        if backend is SdpaBackend.FLASH:
            return aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale
            )[0]
        if backend is SdpaBackend.EFFICIENT:
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


def cudnn_backward_workspace_bytes(
    batch: int, heads: int, queries: int, head_dim: int, deterministic: bool = False
) -> int:
    """Bytes of the workspace the cuDNN backward takes from the caching allocator (MHA.cpp
    `run_cudnn_SDP_bprop`: `CUDACachingAllocator::get()->allocate(mha_graph.get_workspace_size())`,
    freed when the op returns). The cuDNN frontend's part (cudnn_frontend SDPA backward node,
    `get_fe_workspace_size_node`): the float32 dQ accumulator, `b * h_q * s_q * d_qk * 4` bytes,
    unless the dP-workspace variant runs (deterministic algorithms or a bias gradient; the size
    heuristic is gone from cuDNN 9.0), and the float32 `softmax_sum` (dO . O per row), `b * h_q *
    s_q * 4` bytes. The engine's own workspace is not known without a GPU (taken as 0); for
    grouped-query attention newer frontends add full-head dK/dV buffers (not modelled)."""
    accumulator = 0 if deterministic else batch * heads * queries * head_dim * 4
    return accumulator + batch * heads * queries * 4


@register_op_rule(aten._scaled_dot_product_cudnn_attention_backward)
def cudnn_attention_backward_scratch(ctx: RuleContext, op, args: tuple, kwargs: dict):
    """Besides dQ, dK, dV (the op's outputs, laid out as query, key, value): a copy of the
    incoming gradient in the output's layout when its last dimension is not contiguous (MHA.cpp
    `permute_to_matching_layout(o, dO_)`, cuDNN >= 9.5.1; e.g. the expanded gradient of
    `out.sum()`), then the cuDNN workspace (`cudnn_backward_workspace_bytes`); both are freed
    when the op returns."""
    grad_out, query = args[0], args[1]
    yield  # grad_q, grad_k, grad_v
    grad_out_copy = None
    if grad_out.stride(-1) != 1:
        grad_out_copy = ctx.scratch(grad_out.numel() * grad_out.element_size(),
                                    category="temporary", op="cudnn_attention_backward[scratch]")
    deterministic = torch.are_deterministic_algorithms_enabled()
    batch, heads, queries, head_dim = query.shape
    workspace = ctx.scratch(
        cudnn_backward_workspace_bytes(batch, heads, queries, head_dim, deterministic),
        category="workspace", op="cudnn_attention_backward[workspace]",
    )
    ctx.release(workspace)
    if grad_out_copy is not None:
        ctx.release(grad_out_copy)

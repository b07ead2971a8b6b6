"""Batch norm (cuDNN) and group norm: the CUDA kernels' allocations beside their outputs
(aten/src/ATen/native/cudnn/BatchNorm.cpp, aten/src/ATen/native/cuda/group_norm_kernel.cu)."""

import dataclasses

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.cuda_rules.norms import cudnn_batch_norm_applies
from peakmem.profiles import Sourced
from tests.capture.capture_helpers import allocations

N, C, H, W = 8, 16, 10, 10
X = N * C * H * W * 4


def _with_bn_workspaces(stack, forward, reserve, backward):
    sizes = {
        "cudnn_batch_norm_forward": forward,
        "cudnn_batch_norm_reserve": reserve,
        "cudnn_batch_norm_backward": backward,
    }
    return dataclasses.replace(
        stack, kernel_workspace={k: Sourced(v, "test") for k, v in sizes.items()}
    )


def _bn_job(input_grad=True):
    def job():
        bn = torch.nn.BatchNorm2d(C).cuda()
        x = torch.randn(N, C, H, W, device="cuda", requires_grad=input_grad)
        bn(x).sum().backward()

    return job


def test_cudnn_batch_norm_records_workspace_and_reserve(a100, stack24):
    stack = _with_bn_workspaces(stack24, forward=4096, reserve=1536, backward=8192)
    result = capture_callable(_bn_job(), gpu=a100, stack=stack)
    forward = [(size, tag.op) for size, tag in allocations(result.trace, phase="forward")]
    assert forward[:5] == [
        (4096, "cudnn_batch_norm[workspace]"),  # live around the outputs
        (1536, "cudnn_batch_norm[reserve]"),
        (X, "native_batch_norm.default"),
        (C * 4, "native_batch_norm.default"),  # save_mean, float [C]
        (C * 4, "native_batch_norm.default"),  # save_var (invstd), float [C]
    ]
    backward = [(size, tag.op) for size, tag in allocations(result.trace, phase="backward")]
    bn_backward = [entry for entry in backward if "batch_norm" in entry[1]]
    assert bn_backward == [
        (X, "native_batch_norm_backward.default"),
        (C * 4, "native_batch_norm_backward.default"),
        (C * 4, "native_batch_norm_backward.default"),
        (8192, "cudnn_batch_norm_backward[workspace]"),
    ]


def test_cudnn_batch_norm_reserve_lives_until_backward(a100, stack24):
    stack = _with_bn_workspaces(stack24, forward=0, reserve=1536, backward=0)
    result = capture_callable(_bn_job(), gpu=a100, stack=stack)
    events = list(result.trace.events())
    reserve_ids = [ident for kind, ident, size, _s, _t in events if kind.name == "ALLOC" and size == 1536]
    assert len(reserve_ids) == 1
    freed_at = [i for i, (kind, ident, *_rest) in enumerate(events) if kind.name == "FREE" and ident == reserve_ids[0]]
    backward_starts = min(i for i, (kind, *_r) in enumerate(events) if kind.name == "ALLOC" and result.trace.tag_of(i).phase == "backward")
    assert freed_at and freed_at[0] > backward_starts


def test_shipped_stacks_assume_no_cudnn_batch_norm_workspace(a100, stack24):
    # the sizes are unknown without a GPU: listed as assumed, zero, so nothing is added yet
    for key in ("cudnn_batch_norm_forward", "cudnn_batch_norm_reserve", "cudnn_batch_norm_backward"):
        assert stack24.kernel_workspace[key].assumed
        assert stack24.kernel_workspace_bytes(key) == 0
    result = capture_callable(_bn_job(), gpu=a100, stack=stack24)
    assert not any("cudnn" in (tag.op or "") for _size, tag in allocations(result.trace))


@pytest.mark.parametrize(
    "shape, dtype, weight_dtype, training, expected",
    [
        ((8, 16, 4, 4), torch.float32, torch.float32, True, True),
        ((8, 16), torch.float32, torch.float32, True, False),  # 2-d input: native kernel
        ((8, 16, 4, 4), torch.bfloat16, torch.bfloat16, True, False),
        ((8, 16, 4, 4), torch.float16, torch.float16, True, False),  # half needs float weights
        ((8, 16, 4, 4), torch.float16, torch.float32, True, True),
        ((70000, 1, 2), torch.float32, torch.float32, False, False),  # eval batch over 65535
        ((70000, 1, 2), torch.float32, torch.float32, True, True),
    ],
)
def test_cudnn_batch_norm_conditions(shape, dtype, weight_dtype, training, expected):
    x = torch.empty(shape, dtype=dtype, device="meta")
    w = torch.empty(shape[1], dtype=weight_dtype, device="meta")
    assert cudnn_batch_norm_applies(x, w, w, w, w, training) is expected


def test_group_norm_scratch(a100, stack24):
    groups = 4

    def job():
        gn = torch.nn.GroupNorm(groups, C).cuda()
        x = torch.randn(N, C, H, W, device="cuda", requires_grad=True)
        gn(x).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    forward = [(s, t.op) for s, t in allocations(result.trace, phase="forward") if "group_norm" in t.op]
    nc, ng = N * C * 4, N * groups * 4
    assert forward == [
        (X, "native_group_norm.default"),
        (ng, "native_group_norm.default"),
        (ng, "native_group_norm.default"),
        (nc, "native_group_norm[scratch]"),  # a
        (nc, "native_group_norm[scratch]"),  # b
    ]
    backward = [(s, t.op) for s, t in allocations(result.trace, phase="backward") if "group_norm" in t.op]
    scratch = "native_group_norm_backward[scratch]"
    assert backward == [
        (X, "native_group_norm_backward.default"),
        (C * 4, "native_group_norm_backward.default"),
        (C * 4, "native_group_norm_backward.default"),
        (nc, scratch),  # ds
        (nc, scratch),  # db
        (ng, scratch),  # c2
        (ng, scratch),  # c3
        (nc, scratch),  # c1 = rstd * gamma, [N, G, D]
    ]


def test_group_norm_without_affine_has_no_forward_scratch(a100, stack24):
    def job():
        gn = torch.nn.GroupNorm(4, C, affine=False).cuda()
        x = torch.randn(N, C, H, W, device="cuda", requires_grad=True)
        gn(x).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert not allocations(result.trace, op="native_group_norm[scratch]")
    backward = [s for s, t in allocations(result.trace, op="native_group_norm_backward[scratch]")]
    assert backward == [N * C * 4, N * C * 4, N * 4 * 4, N * 4 * 4]  # no c1 without gamma


# Layer norm (aten/src/ATen/native/cuda/layer_norm_kernel.cu, torch 2.4-2.6): `layer_norm_cuda`
# and `layer_norm_backward_cuda` run on input.expect_contiguous(), and the backward kernel on
# dY.contiguous(): a dense copy for a non-contiguous tensor (ConvNeXt's permuted activations),
# nothing for a contiguous one.
LN_BYTES = N * C * H * W * 4


def _layer_norm_job(permuted: bool):
    def job():
        ln = torch.nn.LayerNorm(C).cuda()
        x = torch.randn(N, C, H, W, device="cuda", requires_grad=True)
        y = x.permute(0, 2, 3, 1) if permuted else x.reshape(N, H, W, C)
        out = ln(y)
        # permuted: back to NCHW and dense, as LayerNorm2d hands its output to a convolution,
        # so the gradient arrives permuted; pow makes it a dense tensor (sum's alone is an
        # expanded one)
        (out.permute(0, 3, 1, 2).contiguous() if permuted else out).pow(2).sum().backward()

    return job


def _ops(trace, phase):
    return [(size, tag.op) for size, tag in allocations(trace, phase=phase) if "layer_norm" in tag.op]


def test_layer_norm_copies_a_non_contiguous_input_around_its_outputs(a100, stack24):
    trace = capture_callable(_layer_norm_job(permuted=True), gpu=a100, stack=stack24).trace
    assert _ops(trace, "forward") == [
        (LN_BYTES, "native_layer_norm[contiguous input]"),  # X, live while Y is made
        (LN_BYTES, "native_layer_norm.default"),  # Y
        (N * H * W * 4, "native_layer_norm.default"),  # mean
        (N * H * W * 4, "native_layer_norm.default"),  # rstd
    ]
    assert _ops(trace, "backward") == [
        (LN_BYTES, "native_layer_norm_backward[contiguous input]"),
        (LN_BYTES, "native_layer_norm_backward.default"),  # dX
        (C * 4, "native_layer_norm_backward.default"),
        (C * 4, "native_layer_norm_backward.default"),
        # the gradient arrives through the output's permute: not contiguous either
        (LN_BYTES, "native_layer_norm_backward[contiguous grad_out]"),
    ]


def test_layer_norm_copy_is_freed_when_the_kernel_returns(a100, stack24):
    from peakmem.trace.events import EventKind

    trace = capture_callable(_layer_norm_job(permuted=True), gpu=a100, stack=stack24).trace
    events = list(trace.events())
    ids = {ident: index for index, (kind, ident, _s, _st, _t) in enumerate(events)
           if kind == EventKind.ALLOC and (trace.tag_of(index).op or "").endswith("[contiguous input]")}
    freed = {ident: index for index, (kind, ident, _s, _st, _t) in enumerate(events)
             if kind == EventKind.FREE and ident in ids}
    assert set(freed) == set(ids)  # every copy is freed
    for ident, at in ids.items():
        between = [trace.tag_of(i).op for i in range(at + 1, freed[ident])
                   if events[i][0] == EventKind.ALLOC]
        assert between and all("layer_norm" in op for op in between)  # only the kernel's own outputs


def test_layer_norm_on_a_contiguous_input_allocates_only_its_outputs(a100, stack24):
    trace = capture_callable(_layer_norm_job(permuted=False), gpu=a100, stack=stack24).trace
    ops = _ops(trace, "forward") + _ops(trace, "backward")
    assert not [op for _size, op in ops if "contiguous" in op]


def test_convnext_block_layer_norm_reads_cudnns_channels_last_output_without_a_copy(a100, stack24):
    # ConvNeXt: a block's input is channels-last (its residual sum of a permuted output), so
    # cuDNN runs the depthwise convolution in channels-last; permuted to NHWC, that output is
    # contiguous and LayerNorm copies nothing (cuda_rules/convolution.py `convolution_output`).
    def job():
        dwconv = torch.nn.Conv2d(C, C, 7, padding=3, groups=C).cuda()
        ln = torch.nn.LayerNorm(C).cuda()
        x = torch.randn(N, C, H, W, device="cuda").contiguous(memory_format=torch.channels_last)
        x.requires_grad_(True)
        ln(dwconv(x).permute(0, 2, 3, 1)).pow(2).sum().backward()

    trace = capture_callable(job, gpu=a100, stack=stack24).trace
    ops = _ops(trace, "forward") + _ops(trace, "backward")
    assert ops and not [op for _size, op in ops if "contiguous" in op]

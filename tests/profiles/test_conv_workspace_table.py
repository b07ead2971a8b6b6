"""The per-shape cuDNN workspace table (sm_90, cuDNN 9.19, torch 2.11) made from the H200 grid
(benchmarks/groundtruth/h200_cudnn_grid.csv.gz): exact lookup, the nearest-neighbour fallback,
the selection per GPU through the stack profile, and the rule that uses it."""

import dataclasses

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.profiles import load_gpu, load_stack
from peakmem.profiles.conv_workspace_table import (
    TABLE_COLUMNS,
    ConvShape,
    channel_alignment,
    load_table,
    parse_table,
)
from tests.cuda_rules.test_convolution import workspaces

TABLE = "cudnn_workspace/sm90_cudnn91900_torch-2.11.csv.gz"

# Rows of the grid (case 1x64x56x56-64-k3s1p1d1g1b0, NCHW, benchmark off): workspace_bytes
GRID_1x64x56 = {
    "tf32": {"forward": 950288, "backward_data": 1753104, "backward_weight": 4202496},
    "bf16": {"forward": 876560, "backward_data": 876560, "backward_weight": 4202496},
    "fp32": {"forward": 0, "backward_data": 0, "backward_weight": 4202496},
}


def shape(n=1, cin=64, hw=56, cout=64, kernel=3, stride=1, padding=1, mode="tf32", layout="nchw"):
    return ConvShape(n, cin, hw, hw, cout, kernel, stride, padding, 1, 1, mode, layout)


@pytest.fixture(scope="module")
def table():
    return load_table(TABLE)


@pytest.mark.parametrize("mode", sorted(GRID_1x64x56))
def test_exact_lookup_gives_the_grid_rows(table, mode):
    for direction, size in GRID_1x64x56[mode].items():
        answer = table.lookup(shape(mode=mode), direction)
        assert (answer.bytes, answer.how) == (size, "exact")


def test_exact_lookup_of_the_resnet_stem(table):
    # 32x3x224x224 -> 64, 7x7 stride 2: the grid's forward workspace is x + y + w + 16 bytes
    stem = shape(n=32, cin=3, hw=224, kernel=7, stride=2, padding=3)
    assert table.lookup(stem, "forward").bytes == 122065680 == stem.tensor_bytes + 16


def test_fallback_answers_a_held_out_shape_from_its_neighbours(table):
    """The 1x64x56x56 case left out: its neighbours (the same layer at other batch sizes and
    random shapes) give its backward-data workspace (x + y + w + 16 bytes) within 2%."""
    target = shape(mode="bf16")
    held_out = table.without(lambda case: case.shape.key[:10] != target.key[:10])
    assert held_out.exact(target, "backward_data") is None
    answer = held_out.lookup(target, "backward_data")
    assert answer.how == "nearest"
    assert answer.bytes == pytest.approx(GRID_1x64x56["bf16"]["backward_data"], rel=0.02)


def test_fallback_with_no_measured_case_is_zero():
    empty = parse_table(",".join(TABLE_COLUMNS) + "\n")
    assert empty.lookup(shape(), "forward").bytes == 0


def test_channel_alignment_counts_twos_up_to_eight():
    assert [channel_alignment(c) for c in (3, 6, 12, 64, 63, 0)] == [0, 1, 2, 3, 0, 0]


def test_fallback_follows_aligned_neighbours_for_an_aligned_layer(table):
    """VGG-16's 64 -> 64 3x3 layer at 224x224, batch 32, TF32 (not in the grid): its nearest
    measured cases with aligned channels take about x + y + w in every direction; the
    unaligned GPUMemNet layers beside it (63 -> 71 channels) took up to 4x that for
    backward-weight and are not its neighbours."""
    vgg = shape(n=32, cin=64, hw=224, cout=64)
    for direction in ("forward", "backward_data", "backward_weight"):
        answer = table.lookup(vgg, direction)
        assert answer.how == "nearest"
        assert answer.bytes == pytest.approx(vgg.tensor_bytes, rel=0.05)


def test_table_columns_are_checked():
    with pytest.raises(ValueError, match="columns"):
        parse_table("n,cin\n1,2\n")


def test_stack_selects_the_table_for_sm90_gpus_only():
    stack = load_stack("2.11.0")
    for gpu in ("h200", "h100-80gb"):
        chosen = stack.conv_workspace_table_for(load_gpu(gpu))
        assert chosen is not None and chosen.value == TABLE and not chosen.assumed
    assert stack.conv_workspace_table_for(load_gpu("a100-40gb")) is None
    assert load_stack("2.4.0").conv_workspace_table_for(load_gpu("h200")) is None


def one_conv(dtype=None):
    conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).cuda()
    x = torch.randn(1, 64, 56, 56, device="cuda", requires_grad=True)
    if dtype is None:
        conv(x).sum().backward()
        return
    with torch.autocast("cuda", dtype=dtype):
        conv(x).float().sum().backward()


@pytest.mark.parametrize("tf32, dtype, mode", [(True, None, "tf32"), (False, None, "fp32"),
                                               (True, torch.bfloat16, "bf16")])
def test_captured_conv_takes_the_table_sizes(monkeypatch, tf32, dtype, mode):
    """A capture on the H200 with torch 2.11 records each direction's workspace at the grid's
    size for the job's setting: TF32 as the cudnn flag says, autocast bf16 as bf16."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    result = capture_callable(lambda: one_conv(dtype), gpu=load_gpu("h200"),
                              stack=load_stack("2.11.0"))
    assert result.error is None
    sizes = {op: size for op, size, _phase, _kind in workspaces(result)}
    expected = {f"cudnn_conv_workspace[{d}]": s for d, s in GRID_1x64x56[mode].items() if s}
    assert sizes == expected


def test_gpu_without_table_keeps_the_factor_model():
    stack = load_stack("2.11.0")
    bare = dataclasses.replace(stack, conv_workspace_table={})
    with_table = capture_callable(one_conv, gpu=load_gpu("h200"), stack=stack)
    without = capture_callable(one_conv, gpu=load_gpu("h200"), stack=bare)
    assert workspaces(with_table) != workspaces(without)
    forward = next(size for op, size, *_ in workspaces(without) if op.endswith("[forward]"))
    assert forward == int(0.5 * 1 * 64 * 56 * 56 * 4)  # [cudnn_conv_workspace.default] forward


def test_transposed_and_3d_convolutions_are_not_looked_up():
    from peakmem.cuda_rules.convolution import ConvCall

    common = dict(direction="forward", input_bytes=4, weight_bytes=4, output_bytes=4,
                  dtype=torch.float32, kernel=(3, 3), stride=(1, 1), groups=1,
                  input_shape=(1, 64, 56, 56), weight_shape=(64, 64, 3, 3), padding=(1, 1),
                  dilation=(1, 1))
    assert ConvCall(**common).grid_shape() == shape()
    assert ConvCall(**common, tf32=False).grid_shape() == shape(mode="fp32")
    assert ConvCall(**common, transposed=True).grid_shape() is None
    volume = dict(common, input_shape=(1, 64, 8, 56, 56), weight_shape=(64, 64, 3, 3, 3))
    assert ConvCall(**volume).grid_shape() is None


@pytest.mark.parametrize("dtype, channels_last, cudnn", [
    (torch.bfloat16, False, False), (torch.float32, False, False), (torch.float16, False, True),
    (torch.bfloat16, True, True), (torch.float32, True, True)])
def test_depthwise_backend_as_the_grid_saw_it(dtype, channels_last, cudnn):
    """The H200 grid ran every bf16 and fp32 NCHW depthwise case on CudaDepthwise2d (no
    workspace) and every channels-last one on cuDNN; fp16 NCHW goes to cuDNN for the shapes
    `use_cudnn_depthwise` accepts."""
    from peakmem.cuda_rules.convolution import uses_cudnn

    x = torch.empty(2, 32, 8, 8, dtype=dtype, device="meta")
    weight = torch.empty(32, 1, 3, 3, dtype=dtype, device="meta")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    assert uses_cudnn(x, weight, groups=32, transposed=False) is cudnn

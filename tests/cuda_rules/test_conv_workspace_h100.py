"""cuDNN 9 convolution workspaces on the H100 (torch 2.11): what the committed allocator
snapshot tests/data/snapshots/cnn.pickle shows, and the per-class workspace model.

The snapshot (benchmarks/snapshots/record.py's `cnn` job: four 3x3 convolutions 3->32->64->128
->256 with batch norm, ReLU and 2x2 max pooling, batch 64 of 3x64x64, SGD with momentum, 3
steps; 'NVIDIA H100 80GB HBM3', torch 2.11.0+cu130) holds, for every convolution call, one
allocation freed right after it (Conv_v8.cpp `run_conv_plan`: `allocate(plan.getWorkspaceSize())`,
a DataPtr freed on return), the same size at every step (the plan is cached per shape:
`benchmark_cache.update(key, plan)`), and none for a size-0 workspace. The sizes below were
read from its device trace (alloc immediately followed by free_requested of the same address).
"""

import pytest
import torch
from torch import nn

from peakmem.allocator import simulate
from peakmem.capture import capture_callable
from peakmem.cuda_rules import convolution
from peakmem.cuda_rules.convolution import ConvCall, classed_bytes, conv_class
from peakmem.profiles import load_gpu, load_stack

# (input channels, direction) -> bytes cuDNN 9.19's heuristic plan allocated on the H100
SNAPSHOT_WORKSPACES = {
    (3, "forward"): 0,  # nothing allocated
    (32, "forward"): 8462352,
    (64, "forward"): 12877971,
    (128, "forward"): 15860143,
    # conv 1's input needs no gradient: no backward-data call
    (32, "backward_data"): 25239568,
    (64, "backward_data"): 12877840,
    (128, "backward_data"): 7471120,
    (3, "backward_weight"): 2176,
    (32, "backward_weight"): 29221008,
    (64, "backward_weight"): 17138399,
    (128, "backward_weight"): 11010655,
}
SNAPSHOT_MAX_RESERVED = 373293056  # tests/data/snapshots/cnn.json max_memory_reserved


def snapshot_cnn_job():
    """benchmarks/snapshots/record.py's `cnn` job, without the recording calls."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    channels = 3
    for width in (32, 64, 128, 256):
        layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                   nn.MaxPool2d(2)]
        channels = width
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))
    model = model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(3):
        x, y = torch.randn(64, 3, 64, 64).cuda(), torch.randint(0, 10, (64,)).cuda()
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()


def _simulated_reserved(monkeypatch, sizes, alloc_conf: str = "") -> int:
    monkeypatch.setattr(convolution, "workspace_bytes", lambda ctx, call: sizes(call))
    capture = capture_callable(snapshot_cnn_job, gpu=load_gpu("h100-80gb"),
                               stack=load_stack("2.11.0"))
    assert capture.error is None
    return simulate(capture.trace, alloc_conf, torch_version="2.11").peak_reserved_bytes


# cnn.json and cnn_max_split.json (the same job under max_split_size_mb:64) both recorded this
@pytest.mark.parametrize("alloc_conf", ["", "max_split_size_mb:64"])
def test_snapshot_workspaces_reproduce_the_recorded_reserved_peak(monkeypatch, alloc_conf):
    """With the workspaces the H100 really took, the replay of the captured job reserves what
    torch reported to the byte; without them it is 68 MiB short: the reserved - allocated
    excess of this CNN job is its cuDNN workspaces, not block sizes or allocation order."""
    exact = _simulated_reserved(
        monkeypatch, lambda call: SNAPSHOT_WORKSPACES[(call.input_channels, call.direction)],
        alloc_conf)
    assert exact == SNAPSHOT_MAX_RESERVED
    none = _simulated_reserved(monkeypatch, lambda call: 0, alloc_conf)
    assert SNAPSHOT_MAX_RESERVED - none == 68 * 2**20


def _call(direction, cin, cout, kernel, hw=32, n=64, stride=1):
    out_hw = hw // stride
    return ConvCall(direction=direction, input_bytes=n * cin * hw * hw * 4,
                    weight_bytes=cout * cin * kernel * kernel * 4,
                    output_bytes=n * cout * out_hw * out_hw * 4, dtype=torch.float32,
                    kernel=(kernel, kernel), stride=(stride, stride), groups=1,
                    input_shape=(n, cin, hw, hw), weight_shape=(cout, cin, kernel, kernel))


def test_classes_stem_pointwise_and_others():
    assert conv_class(_call("forward", 3, 64, 7, hw=224, stride=2)) == "stem"
    assert conv_class(_call("forward", 64, 256, 1)) == "pointwise"
    assert conv_class(_call("forward", 64, 64, 3)) == ""


def test_lowered_bytes_is_the_im2col_operand():
    call = _call("forward", 3, 64, 7, hw=224, stride=2, n=2)
    # one row per output position (2 x 112 x 112), one column per tap (3 x 7 x 7), fp32
    assert call.lowered_bytes == 2 * 112 * 112 * 3 * 7 * 7 * 4


def test_classed_model_takes_the_class_keys_or_falls_back_to_the_plain_ones():
    model = {"forward": 1.0, "backward_weight": 2.0, "stem_forward_per_lowered": 0.5,
             "pointwise_forward": 0.0}
    stem = _call("forward", 3, 64, 7, hw=224, stride=2)
    assert classed_bytes(model, stem) == int(0.5 * stem.lowered_bytes)
    pointwise = _call("forward", 64, 256, 1)
    assert classed_bytes(model, pointwise) == 0  # its own key, zero
    other = _call("forward", 64, 64, 3)
    assert classed_bytes(model, other) == other.input_bytes
    # the stem class has no backward-weight keys: the plain factor applies
    stem_bw = _call("backward_weight", 3, 64, 7, hw=224, stride=2)
    assert classed_bytes(model, stem_bw) == 2 * stem_bw.input_bytes


def test_profile_accepts_class_keys_and_rejects_unknown_classes():
    from peakmem.profiles import ProfileError
    from peakmem.profiles.loader import _conv_model

    assert _conv_model({"stem_forward_per_lowered": 1, "source": "s"}, "here").value == {
        "stem_forward_per_lowered": 1.0}
    with pytest.raises(ProfileError, match="unknown keys"):
        _conv_model({"depthwise_forward": 1, "source": "s"}, "here")


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_weight"])
@pytest.mark.parametrize(("cin", "kernel"), [(3, 7), (64, 1), (64, 3)])
def test_a100_torch24_workspaces_are_unchanged_by_the_classes(direction, cin, kernel):
    """A model without class keys (the A100 / torch-2.4 fit) sizes every class as before."""
    from peakmem.cuda_rules.convolution import model_bytes

    model = load_stack("2.4.1").conv_workspace_for(load_gpu("a100-40gb")).value
    call = _call(direction, cin, 64, kernel, hw=56)
    assert classed_bytes(model, call) == model_bytes(model, call, direction, f"{direction}_per_weight")
    assert classed_bytes(model, call) > 0


def test_h100_model_holds_the_snapshots_plain_factors():
    """The torch-2.11 H100 model's 3x3 factors are the snapshot's largest convolution's ratios."""
    model = load_stack("2.11.0").conv_workspace_for(load_gpu("h100-80gb"))
    assert "snapshot" in model.source and "calibration split" in model.source
    x, y = 64 * 32 * 32 * 32 * 4, 64 * 64 * 32 * 32 * 4  # conv 32->64 at 32x32, batch 64, fp32
    measured = {"forward": SNAPSHOT_WORKSPACES[(32, "forward")] / x,
                "backward_data": SNAPSHOT_WORKSPACES[(32, "backward_data")] / y,
                "backward_weight": SNAPSHOT_WORKSPACES[(32, "backward_weight")] / x}
    for direction, ratio in measured.items():
        assert model.value[direction] == pytest.approx(ratio, abs=0.05)
    assert {"stem_forward", "pointwise_forward"} <= set(model.value)


def test_profile_schema_names_the_rules_classes_and_terms():
    """The loader validates model keys without importing torch; it must name what the rule reads."""
    from peakmem.cuda_rules.convolution import CONV_CLASSES, TERMS
    from peakmem.profiles.loader import CONV_MODEL_CLASSES, CONV_MODEL_TERMS

    assert tuple(name for name, _test in CONV_CLASSES) == CONV_MODEL_CLASSES
    assert tuple(TERMS) == CONV_MODEL_TERMS

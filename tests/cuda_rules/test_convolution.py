"""cuDNN convolution rule: one transient workspace per call and direction, sized by the stack
profile's model, and the library memory charged once."""

import dataclasses

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.cuda_rules.convolution import ConvCall, uses_cudnn
from peakmem.profiles import Sourced
from peakmem.trace.events import EventKind
from tests.capture.capture_helpers import allocations

MODEL = {"forward": 2.0, "backward_data": 0.5, "backward_weight": 1.0}


@pytest.fixture
def stack_with_model(a100, stack24):
    return dataclasses.replace(
        stack24,
        conv_workspace={a100.name: Sourced(MODEL, "test")},
        library={a100.name: {"cudnn_convolution": Sourced(300 * 2**20, "test")}},
    )


def two_convs():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, stride=2)
    ).cuda()
    model(torch.randn(2, 3, 16, 16, device="cuda")).sum().backward()


def workspaces(result):
    found = []
    for index, (kind, _ident, size, _stream, _tag) in enumerate(result.trace.events()):
        tag = result.trace.tag_of(index)
        if tag is not None and (tag.op or "").startswith("cudnn_conv_workspace"):
            found.append((tag.op, size, tag.phase, kind))
    return found


def test_workspace_per_direction_from_the_model(a100, stack_with_model):
    result = capture_callable(two_convs, gpu=a100, stack=stack_with_model)
    x1 = 2 * 3 * 16 * 16 * 4  # input of conv 1 (fp32)
    y1 = 2 * 8 * 16 * 16 * 4  # its output = input of conv 2
    y2 = 2 * 4 * 7 * 7 * 4  # conv 2 output (stride 2, no padding: 7x7)
    alloc = EventKind.ALLOC_OR_SMALLER
    assert workspaces(result) == [
        ("cudnn_conv_workspace[forward]", int(2.0 * x1), "forward", alloc),
        ("cudnn_conv_workspace[forward]", int(2.0 * y1), "forward", alloc),
        # conv 2 backward: grad_input (reads grad_output y2), then grad_weight (reads x = y1)
        ("cudnn_conv_workspace[backward_data]", int(0.5 * y2), "backward", alloc),
        ("cudnn_conv_workspace[backward_weight]", int(1.0 * y1), "backward", alloc),
        # conv 1: its input needs no grad, so no backward-data call
        ("cudnn_conv_workspace[backward_weight]", int(1.0 * x1), "backward", alloc),
    ]
    # each workspace is freed right after its allocation
    frees = [result.trace.kinds[i + 1] for i, (k, *_rest) in enumerate(result.trace.events())
             if (result.trace.tag_of(i) and (result.trace.tag_of(i).op or "").startswith("cudnn"))]
    assert frees == [EventKind.FREE] * 5
    assert result.libraries == {"cudnn_convolution": 300 * 2**20}


def test_no_model_no_workspace_but_library_still_charged(a100, stack24):
    bare = dataclasses.replace(stack24, conv_workspace={}, library={})
    result = capture_callable(two_convs, gpu=a100, stack=bare)
    assert workspaces(result) == []
    assert result.libraries == {"cudnn_convolution": 0}  # no figure: 0, listed as assumed


def test_jobs_without_convolutions_load_no_cudnn(a100, stack_with_model):
    def mlp():
        torch.nn.Linear(8, 8).cuda()(torch.randn(4, 8, device="cuda")).sum().backward()

    result = capture_callable(mlp, gpu=a100, stack=stack_with_model)
    assert result.libraries == {}
    assert allocations(result.trace, "workspace", op="cudnn") == []


def test_cudnn_disabled_means_no_workspace(a100, stack_with_model):
    def job():
        with torch.backends.cudnn.flags(enabled=False):
            two_convs()

    result = capture_callable(job, gpu=a100, stack=stack_with_model)
    assert workspaces(result) == []


def test_depthwise_fp32_uses_the_native_kernel():
    x = torch.empty(2, 8, 16, 16, device="meta")
    depthwise = torch.empty(8, 1, 3, 3, device="meta")
    assert not uses_cudnn(x, depthwise, groups=8, transposed=False)
    assert uses_cudnn(x.half(), depthwise.half(), groups=8, transposed=False)
    assert uses_cudnn(x, torch.empty(4, 2, 3, 3, device="meta"), groups=4, transposed=False)


def test_depthwise_fp32_on_a_channels_last_input_or_weight_uses_cudnn():
    # Convolution.cpp `use_cudnn_depthwise`: "always use cudnn_depthwise for channels_last format"
    x = torch.empty(2, 8, 16, 16, device="meta")
    depthwise = torch.empty(8, 1, 3, 3, device="meta")
    channels_last = x.contiguous(memory_format=torch.channels_last)
    assert uses_cudnn(channels_last, depthwise, groups=8, transposed=False)
    weight_cl = torch.empty(8, 2, 3, 3, device="meta").contiguous(memory_format=torch.channels_last)
    assert uses_cudnn(torch.empty(2, 16, 16, 16, device="meta"), weight_cl, groups=8, transposed=False) is True


def _conv_outputs(a100, stack, channels_last: bool):
    """A depthwise and a plain convolution on one input: their output strides and workspaces."""
    seen = []

    def job():
        x = torch.randn(2, 16, 10, 10, device="cuda")
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        for conv in (torch.nn.Conv2d(16, 16, 7, padding=3, groups=16), torch.nn.Conv2d(16, 8, 3)):
            seen.append(conv.cuda()(x).is_contiguous(memory_format=torch.channels_last))

    result = capture_callable(job, gpu=a100, stack=stack)
    return seen, [size for _op, size, _phase, _kind in workspaces(result)]


def test_cudnn_convolves_a_channels_last_input_into_a_channels_last_output(a100, stack_with_model):
    layouts, workspaces_made = _conv_outputs(a100, stack_with_model, channels_last=True)
    assert layouts == [True, True]  # torch's meta kernel alone returns contiguous outputs
    x_bytes = 2 * 16 * 10 * 10 * 4
    assert workspaces_made == [int(MODEL["forward"] * x_bytes)] * 2  # the depthwise one on cuDNN too


def test_a_contiguous_input_keeps_contiguous_outputs_and_the_native_depthwise_kernel(a100, stack_with_model):
    layouts, workspaces_made = _conv_outputs(a100, stack_with_model, channels_last=False)
    assert layouts == [False, False]
    assert workspaces_made == [int(MODEL["forward"] * 2 * 16 * 10 * 10 * 4)]  # the plain one only


def test_basis_is_grad_output_for_backward_data_only():
    kwargs = dict(input_bytes=100, weight_bytes=7, output_bytes=40, dtype=torch.float32,
                  kernel=(3, 3), stride=(1, 1), groups=1)
    assert ConvCall("forward", **kwargs).basis_bytes == 100
    assert ConvCall("backward_weight", **kwargs).basis_bytes == 100
    assert ConvCall("backward_data", **kwargs).basis_bytes == 40


def test_estimate_adds_library_memory_to_the_peak(a100, stack_with_model):
    from peakmem.estimate.api import estimate_capture

    result = capture_callable(two_convs, gpu=a100, stack=stack_with_model)
    estimate = estimate_capture(result, a100, stack_with_model, torch_version="2.4.1")
    assert estimate.library_bytes == 300 * 2**20
    assert estimate.peak_bytes == (
        estimate.context_bytes + 300 * 2**20 + estimate.peak_reserved_bytes
    )
    assert estimate.to_json()["libraries"] == {"cudnn_convolution": 300 * 2**20}


def test_benchmark_searches_once_per_shape_then_empties_the_cache(a100, stack_with_model):
    bench_model = dict(MODEL, benchmark=10.0)
    stack = dataclasses.replace(stack_with_model, conv_workspace={a100.name: Sourced(bench_model, "test")})
    conv = None

    def job():
        nonlocal conv
        torch.backends.cudnn.benchmark = True
        try:
            conv = torch.nn.Conv2d(3, 8, 3, padding=1).cuda()
            for batch in (2, 2, 4):  # the second call reuses the plan; a new shape searches again
                conv(torch.randn(batch, 3, 16, 16, device="cuda"))
        finally:
            torch.backends.cudnn.benchmark = False

    result = capture_callable(job, gpu=a100, stack=stack)
    x2, x4 = 2 * 3 * 16 * 16 * 4, 4 * 3 * 16 * 16 * 4
    trace = result.trace
    events = []
    for index, (kind, _ident, size, _stream, _tag) in enumerate(trace.events()):
        tag = trace.tag_of(index)
        if kind == EventKind.EMPTY_CACHE:
            events.append("empty_cache")
        elif tag is not None and (tag.op or "").startswith("cudnn_"):
            events.append((tag.op.split("[")[0], size))
    assert events == [
        ("cudnn_benchmark_workspace", 10 * x2), "empty_cache", ("cudnn_conv_workspace", 2 * x2),
        ("cudnn_conv_workspace", 2 * x2),
        ("cudnn_benchmark_workspace", 10 * x4), "empty_cache", ("cudnn_conv_workspace", 2 * x4),
    ]


def test_benchmark_search_takes_at_least_the_heuristic_plans_workspace(a100, stack_with_model):
    """Conv_v8.cpp get_plans_from_find times the heuristics' plans and the fallback list's and
    allocates the largest workspace among them (the cap, cacheInfo from 0, is the free device
    memory): the heuristic plan is one of them, so a `benchmark` factor below the direction's
    still searches with the direction's workspace."""
    small = dict(MODEL, benchmark=0.25)  # forward is 2.0
    stack = dataclasses.replace(stack_with_model, conv_workspace={a100.name: Sourced(small, "test")})

    def job():
        torch.backends.cudnn.benchmark = True
        try:
            torch.nn.Conv2d(3, 8, 3, padding=1).cuda()(torch.randn(2, 3, 16, 16, device="cuda"))
        finally:
            torch.backends.cudnn.benchmark = False

    result = capture_callable(job, gpu=a100, stack=stack)
    x2 = 2 * 3 * 16 * 16 * 4
    sizes = [(result.trace.tag_of(i).op.split("[")[0], size)
             for i, (_kind, _ident, size, _stream, _tag) in enumerate(result.trace.events())
             if result.trace.tag_of(i) is not None
             and (result.trace.tag_of(i).op or "").startswith("cudnn_")]
    assert sizes == [("cudnn_benchmark_workspace", 2 * x2), ("cudnn_conv_workspace", 2 * x2)]


@pytest.mark.parametrize("inference", [False, True])
def test_inference_mode_convolutions_take_their_workspace_and_search(a100, stack_with_model, inference):
    """Under torch.inference_mode() conv2d / conv_transpose2d reach the capture whole, not as
    aten.convolution (no autograd key to decompose them at); on CUDA they run the same cuDNN
    call: one forward workspace each, and under cudnn.benchmark one search per new shape (the
    key shared with aten.convolution's, so a shape seen in training is not searched again)."""
    bench_model = dict(MODEL, benchmark=10.0)
    stack = dataclasses.replace(stack_with_model, conv_workspace={a100.name: Sourced(bench_model, "test")})

    def job():
        torch.backends.cudnn.benchmark = True
        try:
            conv = torch.nn.Conv2d(3, 8, 3, padding="same").cuda()
            up = torch.nn.ConvTranspose2d(8, 4, 2, stride=2).cuda()
            x = torch.randn(2, 3, 16, 16, device="cuda")
            with torch.no_grad():
                up(conv(x))  # aten.convolution: searches both shapes
            with torch.inference_mode(inference):
                up(conv(x))  # the same shapes: the plans are cached, no search
                conv(torch.randn(4, 3, 16, 16, device="cuda"))  # a new shape: searches
        finally:
            torch.backends.cudnn.benchmark = False

    result = capture_callable(job, gpu=a100, stack=stack)
    x2, x4 = 2 * 3 * 16 * 16 * 4, 4 * 3 * 16 * 16 * 4
    y2 = 2 * 8 * 16 * 16 * 4  # conv's output = the transposed convolution's input
    sizes = [(result.trace.tag_of(i).op.split("[")[0], size)
             for i, (_kind, _ident, size, _stream, _tag) in enumerate(result.trace.events())
             if result.trace.tag_of(i) is not None
             and (result.trace.tag_of(i).op or "").startswith("cudnn_")]
    assert sizes == [
        ("cudnn_benchmark_workspace", 10 * x2), ("cudnn_conv_workspace", 2 * x2),
        ("cudnn_benchmark_workspace", 10 * y2), ("cudnn_conv_workspace", 2 * y2),
        ("cudnn_conv_workspace", 2 * x2), ("cudnn_conv_workspace", 2 * y2),
        ("cudnn_benchmark_workspace", 10 * x4), ("cudnn_conv_workspace", 2 * x4),
    ]


def test_per_weight_term_adds_to_the_direction(a100, stack_with_model):
    model = dict(MODEL, backward_weight_per_weight=4.0)
    stack = dataclasses.replace(stack_with_model, conv_workspace={a100.name: Sourced(model, "test")})
    result = capture_callable(two_convs, gpu=a100, stack=stack)
    x1, y1 = 2 * 3 * 16 * 16 * 4, 2 * 8 * 16 * 16 * 4
    w1, w2 = 8 * 3 * 3 * 3 * 4, 4 * 8 * 3 * 3 * 4
    sizes = [size for op, size, _phase, _kind in workspaces(result) if "backward_weight" in op]
    assert sizes == [int(1.0 * y1 + 4.0 * w2), int(1.0 * x1 + 4.0 * w1)]


def test_profile_rejects_unknown_model_keys():
    from peakmem.profiles import ProfileError
    from peakmem.profiles.loader import _conv_model

    assert _conv_model({"forward": 1, "source": "s"}, "here").value == {"forward": 1.0}
    with pytest.raises(ProfileError, match="unknown keys"):
        _conv_model({"forwrd": 1, "source": "s"}, "here")


def test_estimate_states_the_calibrated_margin_for_its_kind_of_job(a100, stack24):
    from peakmem.estimate.api import estimate_capture

    conv = estimate_capture(capture_callable(two_convs, gpu=a100, stack=stack24), a100, stack24,
                            torch_version="2.4.1")
    assert conv.margin_kind == "cudnn_convolution"
    assert conv.safety_margin == stack24.safety_margin_for(a100, "cudnn_convolution").value > 0.1
    assert conv.to_json()["peak_bytes_with_margin"] == int(conv.peak_bytes * (1 + conv.safety_margin))

    def mlp():
        torch.nn.Linear(8, 8).cuda()(torch.randn(4, 8, device="cuda")).sum().backward()

    plain = estimate_capture(capture_callable(mlp, gpu=a100, stack=stack24), a100, stack24,
                             torch_version="2.4.1")
    assert plain.margin_kind == "default"
    assert 0 < plain.safety_margin < 0.05

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from peakmem.capture import capture_callable
from peakmem.utilization.estimate import utilization_of
from peakmem.utilization.model import ModelParams, StepFormatError, StepOps, utilization
from peakmem.utilization.observer import META_KEY


def _train(width: int, depth: int, batch: int, samples: int = 256, item: bool = True):
    def job():
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(width, 4)).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        data = TensorDataset(torch.randn(samples, width), torch.randint(0, 4, (samples,)))
        loss_fn = nn.CrossEntropyLoss()
        for _ in range(3):
            for x, y in DataLoader(data, batch_size=batch, shuffle=True):
                x, y = x.cuda(), y.cuda()
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                if item:
                    loss.item()

    return job


@pytest.fixture(scope="module")
def gpu():
    from peakmem.profiles import load_gpu

    return load_gpu("a100-40gb")


def _record(job, gpu, steps=5):
    from peakmem.profiles import load_stack

    result = capture_callable(job, gpu=gpu, stack=load_stack("2.4.1"), steps=steps)
    assert result.error is None, result.error_text
    return result, result.trace.meta[META_KEY]


def test_capture_records_a_full_steady_step(gpu):
    _, record = _record(_train(64, 2, batch=48, samples=200), gpu)
    assert record["steady"] is True and record["step"] >= 2
    names = [op[0] for op in record["ops"]]
    assert names.count("addmm") == 3  # three Linear layers forward
    assert any(n.startswith("_foreach_") for n in names)  # Adam's foreach kernels
    assert set(record["phases"]) >= {"forward", "backward", "optimizer"}
    # a full batch of 48 (not the epoch's last batch of 200 % 48 = 8): x and y copied in
    assert record["input_bytes"] == 48 * 64 * 4 + 48 * 8
    assert record["syncs_before"][0] == 1  # the previous step's loss.item()
    assert record["host_ops"] > 48  # the DataLoader indexes each sample on the host
    json.dumps(record)  # travels in the trace header


def test_wider_layers_keep_the_gpu_busier(gpu):
    small = StepOps.from_meta(_record(_train(128, 2, batch=64), gpu)[1])
    big = StepOps.from_meta(_record(_train(2048, 2, batch=64), gpu)[1])
    u_small, u_big = utilization(small, gpu), utilization(big, gpu)
    for u in (u_small, u_big):
        for value in (u.gract, u.smact, u.smocc, u.drama, u.fp32a):
            assert 0 <= value <= 1
        assert u.smact <= u.gract + 1e-9
        assert u.iteration_seconds > 0
    assert u_big.gract > u_small.gract and u_big.smact > u_small.smact
    assert u_big.fp32a > u_small.fp32a


def test_a_launch_bound_step_is_set_by_host_dispatch(gpu):
    ops = StepOps.from_meta(_record(_train(16, 4, batch=8), gpu)[1])
    slow_host = ModelParams(host_forward_us=50, host_backward_us=50, host_optimizer_us=50)
    fast = utilization(ops, gpu, ModelParams())
    slow = utilization(ops, gpu, slow_host)
    assert slow.iteration_seconds > fast.iteration_seconds
    assert slow.gract < fast.gract < 0.5  # tiny kernels: the GPU mostly waits for the host


def test_dataloader_workers_overlap_the_loop(gpu):
    ops = StepOps.from_meta(_record(_train(64, 2, batch=32), gpu)[1])
    heavy = ModelParams(loader_op_us=200)
    in_loop = utilization(ops, gpu, heavy, loader_workers=0)
    with_workers = utilization(ops, gpu, heavy, loader_workers=8)
    assert with_workers.iteration_seconds < in_loop.iteration_seconds


def test_faster_gpu_is_less_busy_for_the_same_job(gpu):
    from peakmem.profiles import load_gpu

    ops = StepOps.from_meta(_record(_train(1024, 4, batch=256, samples=1024), gpu)[1])
    a100 = utilization(ops, gpu)
    h100 = utilization(ops, load_gpu("h100-80gb"))
    assert h100.iteration_seconds <= a100.iteration_seconds


def test_estimate_utilization_needs_a_trained_step_and_throughput(gpu):
    result, _ = _record(_train(32, 1, batch=16), gpu)
    notes: list[str] = []
    assumptions: list[str] = []
    u = utilization_of(result, gpu, notes, assumptions=assumptions)
    assert u is not None and set(u.to_json()) == {
        "gract", "smact", "smocc", "drama", "fp32a", "iteration_seconds"
    }
    assert notes == []  # a steady step: nothing to warn about
    assert any("steady-state iteration" in a for a in assumptions)
    result.trace.meta.pop(META_KEY)
    assert utilization_of(result, gpu, []) is None


@pytest.mark.parametrize(
    "record",
    [
        None,
        {"version": 2},
        {"version": 1, "ops": "x", "phases": [], "syncs_before": []},
        {"version": 1, "ops": [["mm", "gemm", 1.0, 1, 1, "f32", 1]], "phases": [], "syncs_before": []},
        {"version": 1, "ops": [["mm", "evil", 1.0, 1, 1, "f32", 1]], "phases": ["forward"],
         "syncs_before": [0]},
        {"version": 1, "ops": [["mm", "gemm", float("nan"), 1, 1, "f32", 1]],
         "phases": ["forward"], "syncs_before": [0]},
        {"version": 1, "ops": [["mm", "gemm", -5, 1, 1, "f32", 1]], "phases": ["forward"],
         "syncs_before": [0]},
        {"version": 1, "ops": [["mm", "gemm", 1, 1, 1, "f32", 1]], "phases": ["forward"],
         "syncs_before": [0], "host_ops": "many"},
        {"version": 1, "ops": [["mm", "gemm", 1, 1, 1, ["f32"], 1]], "phases": ["forward"],
         "syncs_before": [0]},
        {"version": 1, "ops": [["mm", ["gemm"], 1, 1, 1, "f32", 1]], "phases": ["forward"],
         "syncs_before": [0]},
        {"version": 1, "ops": [["mm", "gemm", True, 1, 1, "f32", 1]], "phases": ["forward"],
         "syncs_before": [0]},
        {"version": 1, "ops": [["mm", "gemm", 1, 1, 1, "f32", 1]], "phases": [None],
         "syncs_before": [0]},
    ],
)
def test_malformed_records_are_refused(record):
    with pytest.raises(StepFormatError):
        StepOps.from_meta(record)


def test_an_unreadable_op_turns_the_observer_off_not_the_capture(gpu, monkeypatch):
    import peakmem.utilization.observer as observer

    def broken(*args, **kwargs):
        raise RuntimeError("unusual tensor")

    monkeypatch.setattr(observer, "meta_op_cost", broken)
    result, _ = None, None
    from peakmem.profiles import load_stack

    result = capture_callable(_train(16, 1, batch=8), gpu=gpu, stack=load_stack("2.4.1"), steps=3)
    assert result.error is None and result.steps == 3
    assert META_KEY not in result.trace.meta
    assert any("per-op costs could not be recorded" in n for n in result.notes)
    assert utilization_of(result, gpu, []) is None


def test_a_tampered_record_in_a_capture_gives_a_note_not_an_error(gpu):
    result, _ = _record(_train(16, 1, batch=8), gpu)
    result.trace.meta[META_KEY] = {"version": 1, "ops": [[1, 2, 3]], "phases": [], "syncs_before": []}
    result.trace.meta["loader_workers"] = "lots"
    notes: list[str] = []
    assert utilization_of(result, gpu, notes) is None
    assert any("utilization: not predicted" in n for n in notes)


def _conv_step(share_bytes: float = 4e7) -> StepOps:
    return StepOps.from_meta({
        "version": 1,
        "ops": [["convolution", "conv", 1e9, share_bytes, 1e6, "f32", 1, 1, 1]],
        "phases": ["forward"],
        "syncs_before": [0],
    })


def test_conv_layout_conversions_add_memory_bound_time(gpu):
    ops = _conv_step()
    none = utilization(ops, gpu, ModelParams(conv_layout_share=0.0))
    some = utilization(ops, gpu, ModelParams(conv_layout_share=1.0))
    # the conversions move as many bytes again: more DRAM traffic and more busy GPU time
    assert some.drama > none.drama
    assert some.iteration_seconds > none.iteration_seconds
    # an FP32 convolution on a GPU without TF32 tensor cores (V100) gets no conversions
    from peakmem.profiles import load_gpu

    v100 = load_gpu("v100-32gb")
    assert utilization(ops, v100, ModelParams(conv_layout_share=0.0)) == utilization(
        ops, v100, ModelParams(conv_layout_share=1.0)
    )


def test_launch_gaps_idle_the_gpu_between_kernels(gpu):
    record = {
        "version": 1,
        "ops": [["relu", "elem", 1e3, 8e3, 1e3, "f32", 1]] * 50,
        "phases": ["backward"] * 50,
        "syncs_before": [0] * 50,
    }
    ops = StepOps.from_meta(record)
    fast_host = dict(host_backward_us=1.0, host_step_us=10.0)
    no_gap = utilization(ops, gpu, ModelParams(launch_gap_share=0.01, **fast_host))
    gap = utilization(ops, gpu, ModelParams(launch_gap_share=1.0, **fast_host))
    # 50 back-to-back kernels, each followed by up to the profile's 2.5 us launch overhead
    assert gap.iteration_seconds - no_gap.iteration_seconds == pytest.approx(50 * 0.99 * 2.5e-6, rel=0.05)
    assert gap.gract < no_gap.gract


def test_fit_starts_from_shipped_or_default_values():
    from peakmem.utilization.fit import STARTS
    from peakmem.utilization.model import fitted_params

    assert STARTS["shipped"]() == fitted_params() and STARTS["defaults"]() == ModelParams()


def test_a_reduction_geometry_must_be_numbers():
    record = {"version": 1, "ops": [["sum", "red", 1, 1, 1, "f32", 1, float("nan"), 1]],
              "phases": ["forward"], "syncs_before": [0]}
    with pytest.raises(StepFormatError):
        StepOps.from_meta(record)


def test_remembered_launch_shapes_are_the_rules_own(gpu, monkeypatch):
    """shapes_of's memo of launch shapes (by kernel kind, op view and GPU limits) gives, op for
    op and GPU for GPU, what the kernel_shapes rules compute afresh."""
    from peakmem.profiles import load_gpu
    from peakmem.utilization import model
    from peakmem.utilization.kernel_shapes import SmLimits

    _, record = _record(_train(64, 2, batch=48, samples=200), gpu)
    other = SmLimits.of(load_gpu("rtx3060-12gb"))
    limits = SmLimits.of(gpu)
    assert other != limits
    monkeypatch.setattr(model, "_LAUNCH_SHAPES", {})
    remembered = [model.shapes_of(StepOps.from_meta(record), lim) for lim in (limits, other)]
    assert model._LAUNCH_SHAPES  # the memo was filled ...
    again = [model.shapes_of(StepOps.from_meta(record), lim) for lim in (limits, other)]
    monkeypatch.setattr(model, "MAX_REMEMBERED_SHAPES", 0)
    monkeypatch.setattr(model, "_LAUNCH_SHAPES", {})
    fresh = [model.shapes_of(StepOps.from_meta(record), lim) for lim in (limits, other)]
    assert not model._LAUNCH_SHAPES
    for got in (remembered, again):
        for shapes, expected in zip(got, fresh, strict=True):
            for name in ("launches", "sm_fill", "occupancy", "memory_parallel", "layout_fill",
                         "layout_occupancy"):
                assert getattr(shapes, name).tolist() == getattr(expected, name).tolist(), name
    assert fresh[0].sm_fill.tolist() != fresh[1].sm_fill.tolist()  # the GPUs differ

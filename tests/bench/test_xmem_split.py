"""The declared xMem calibration split (issue 13: at most 20% of the runs) and the mapping of
xMem's measured quantity onto peakmem's outputs."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from peakmem.baselines.peakmem_estimator import (
    after_context_creation_bytes,
    compared_bytes,
    context_at_creation_bytes,
)
from peakmem.bench.calibration import (
    XMEM_BUCKETS,
    XMEM_SPLIT_DESCRIPTION,
    XMEM_TAKEN,
    evaluation_rows,
    in_calibration_split,
    split_key,
    unavailable_at_baseline,
)
from peakmem.datasets.rows import BenchRow
from peakmem.profiles import load_gpu, load_stack

MiB = 2**20


def _row(run_dir: str, *, includes_context: bool = False, dataset: str = "xmem") -> BenchRow:
    return BenchRow(
        id="00000", dataset=dataset, family="VGG16",
        job={"model": "VGG16", "batch_size": 8, "optimizer": "SGD"},
        measured_peak_bytes=MiB, status="ok", gpu="rtx3060-12gb", torch_version="2.6.0",
        gpu_total_bytes=12 * 1024 * MiB, features={"run_dir": run_dir},
        measured_includes_context=includes_context,
    )


def _bucket(run_dir: str) -> int:
    return int(hashlib.sha1(("xmem:" + run_dir).encode()).hexdigest(), 16) % XMEM_BUCKETS


def test_split_is_sha1_of_the_run_directory():
    run_dirs = [f"plot/data/001-Anova/CNN/001/VGG16_SGD_{i}_0_abcd/NVIDIA-GeForce-RTX-3060"
                for i in range(200)]
    for run_dir in run_dirs:
        row = _row(run_dir)
        assert split_key(row) == "xmem:" + run_dir
        assert in_calibration_split(row) == (_bucket(run_dir) < XMEM_TAKEN)
    inside = sum(in_calibration_split(_row(d)) for d in run_dirs)
    assert 0 < inside < len(run_dirs) * 0.3
    assert len(evaluation_rows([_row(d) for d in run_dirs])) == len(run_dirs) - inside
    assert XMEM_TAKEN / XMEM_BUCKETS <= 0.20
    assert "sha1('xmem:' + run_dir)" in XMEM_SPLIT_DESCRIPTION


def test_split_holds_at_most_20_percent_of_the_public_runs(shared_data):
    from peakmem.datasets.loaders import load_rows

    rows = load_rows("xmem", shared_data)
    inside = [r for r in rows if in_calibration_split(r)]
    assert len(rows) == 131 and len(inside) == 26  # 19.8%
    assert len(inside) <= 0.2 * len(rows)


def _estimate(context: int, peak: int, lazy: int | None):
    stack = SimpleNamespace(
        lazy_loaded_for=lambda gpu: SimpleNamespace(value=0 if lazy is None else lazy))
    return SimpleNamespace(context_bytes=context, peak_bytes=peak, stack=stack, gpu=None)


def test_after_context_creation_keeps_the_lazily_loaded_kernels():
    """xMem's baseline follows context creation: what loads after it (lazy kernels) counts,
    the context as created does not."""
    est = _estimate(context=400 * MiB, peak=5000 * MiB, lazy=150 * MiB)
    assert context_at_creation_bytes(est) == 250 * MiB
    assert after_context_creation_bytes(est) == 4750 * MiB
    assert compared_bytes(_row("r"), est) == 4750 * MiB
    assert compared_bytes(_row("r", includes_context=True), est) == 5000 * MiB
    # no figure: the whole context counts as present at creation
    assert after_context_creation_bytes(_estimate(400 * MiB, 5000 * MiB, None)) == 4600 * MiB
    # never more than the context itself is left out
    assert context_at_creation_bytes(_estimate(400 * MiB, 5000 * MiB, 600 * MiB)) == 0


@pytest.mark.parametrize("gpu", ["rtx3060-12gb", "rtx4060-8gb"])
def test_consumer_gpus_have_a_lazily_loaded_figure_in_torch_26(gpu):
    stack, profile = load_stack("2.6.0"), load_gpu(gpu)
    lazy = stack.lazy_loaded_for(profile)
    assert 0 < int(lazy.value) <= int(stack.context_for(profile).value)
    assert "calibration split" in lazy.source


def test_other_stacks_and_gpus_have_none():
    assert int(load_stack("2.4.1").lazy_loaded_for(load_gpu("a100-40gb")).value) == 0
    assert int(load_stack("2.6.0").lazy_loaded_for(load_gpu("h100-80gb")).value) == 0


def _oom(gpu: str, measured_mib: float, total_mib: float, *, status: str = "oom",
         includes_context: bool = False) -> BenchRow:
    return BenchRow(
        id="x", dataset="xmem", family="T5-small", job={}, measured_peak_bytes=int(measured_mib * MiB),
        status=status, gpu=gpu, torch_version="2.6.0", gpu_total_bytes=int(total_mib * MiB),
        measured_includes_context=includes_context,
    )


def test_unavailable_at_baseline_is_bounded_by_the_highest_oom_level():
    """An OOM run held `measured` after the baseline before cudaMalloc failed: whatever was
    unavailable at the baseline is at most total - the highest such level, per GPU."""
    rows = [
        _oom("rtx4060-8gb", 7786, 7932.9), _oom("rtx4060-8gb", 7530, 7932.9),
        _oom("rtx4060-8gb", 7900, 7932.9, status="ok"),  # ran: says nothing about the limit
        _oom("rtx4060-8gb", 7920, 7932.9, includes_context=True),  # baseline before the context
        _oom("rtx3060-12gb", 11882, 12037.4),
    ]
    found = unavailable_at_baseline(rows)
    assert found["rtx4060-8gb"] == int(7932.9 * MiB) - 7786 * MiB
    assert found["rtx3060-12gb"] == int(12037.4 * MiB) - 11882 * MiB
    assert "a100-40gb" not in found
    # the GPU profile's total replaces the row's (the capacity is profile total - context)
    profile = {"rtx3060-12gb": 12044 * MiB}
    assert unavailable_at_baseline(rows, profile)["rtx3060-12gb"] == 162 * MiB


@pytest.mark.parametrize("gpu", ["rtx3060-12gb", "rtx4060-8gb"])
def test_consumer_context_leaves_room_for_what_the_split_oom_runs_reached(shared_data, gpu):
    """The replay's capacity is total - context - libraries; above xMem's baseline that leaves
    total - (context - lazily loaded kernels), which must hold the highest level an OOM run of
    the split reached before cudaMalloc failed (with the old assumed 400 MiB context it did not:
    T5-small b49 reached 7786 MiB on the RTX 4060, 133 MiB above that ceiling)."""
    from peakmem.datasets.loaders import load_rows

    split = [r for r in load_rows("xmem", shared_data) if in_calibration_split(r) and r.gpu == gpu]
    stack, profile = load_stack("2.6.0"), load_gpu(gpu)
    context, lazy = int(stack.context_for(profile).value), int(stack.lazy_loaded_for(profile).value)
    reached = max(r.measured_peak_bytes for r in split if r.status == "oom")
    assert profile.total_memory_bytes - (context - lazy) >= reached
    assert context - lazy == unavailable_at_baseline(split, {gpu: profile.total_memory_bytes})[gpu]
    assert "OOM runs" in stack.context_for(profile).source

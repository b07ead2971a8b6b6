"""Horus, accelerate and DeepSpeed against numbers worked out by hand or published."""

from __future__ import annotations

import pytest
from torch import nn

from peakmem.baselines import get_estimator
from peakmem.baselines.accelerate import model_bytes, training_bytes_fp32_adam
from peakmem.baselines.deepspeed import largest_layer_params, zero2_gpu_bytes, zero3_gpu_bytes
from peakmem.baselines.horus import horus_mib, per_sample_activations
from peakmem.datasets.gpumemnet_jobs import MLPJob
from peakmem.datasets.gpumemnet_models import build_model, make_batch
from peakmem.datasets.loaders import load_rows
from peakmem.datasets.rows import BenchRow, MiB


def _row(job) -> BenchRow:
    return BenchRow(
        "0", "gpumemnet-mlp1", "mlp", job, 1000 * MiB, "ok", "a100-40gb", "2.4.1", 40960 * MiB
    )


def test_horus_formula_by_hand():
    # A=1000, P=2**18, B=4: 4*(4000 + 262144 + 1048576) / 2**20 + 800
    assert horus_mib(1000, 2**18, 4) == pytest.approx(4 * 1314720 / 2**20 + 800)


def test_horus_activations_by_hand_and_estimate():
    job = MLPJob(100, 10, 2, "pyramid", 64)  # Linear(100,50) ReLU Linear(50,25) ReLU Linear(25,10)
    model = build_model(job)
    a = per_sample_activations(model, make_batch(job)[0])
    assert a == 50 + 50 + 25 + 25 + 10
    params = 100 * 50 + 50 + 50 * 25 + 25 + 25 * 10 + 10
    est = get_estimator("horus").estimate(_row(job))
    assert est.peak_bytes == int(horus_mib(160, params, 64) * MiB)


def test_horus_activations_equal_the_datasets_total_activations(fixture_data):
    for row in load_rows("gpumemnet-mlp1", fixture_data):
        model = build_model(row.job)
        assert per_sample_activations(model, make_batch(row.job)[0]) == int(
            row.features["Total Activations"]
        )


def test_accelerate_by_hand_and_published():
    model = nn.Sequential(nn.Linear(10, 10), nn.BatchNorm1d(10))
    # params 110 + 20 fp32, buffers running mean/var 20 fp32 + num_batches_tracked int64
    assert model_bytes(model) == (110 + 20 + 20) * 4 + 8
    # accelerate's docs: bert-base-cased float32 total 413.18 MB -> "Training using Adam" 1.61 GB
    assert training_bytes_fp32_adam(int(413.18 * MiB)) / 2**30 == pytest.approx(1.61, abs=0.01)
    job = MLPJob(100, 10, 1, "uniform", 8)
    params = 100 * 100 + 100 + 100 * 10 + 10
    assert get_estimator("accelerate").estimate(_row(job)).peak_bytes == 16 * params


def test_deepspeed_published_t0_3b():
    # DeepSpeed docs, bigscience/T0_3B (2851M params), 1 GPU, ZeRO-2 offload_optimizer=none:
    # 53.11GB per GPU
    assert zero2_gpu_bytes(2851 * 10**6) / 2**30 == pytest.approx(53.11, abs=0.01)
    assert zero3_gpu_bytes(1000, 100) == 4 * 100 + 18 * 1000
    assert zero2_gpu_bytes(1000, total_gpus=4) == 4000 + 4000
    model = nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 2))
    assert largest_layer_params(model) == 220
    job = MLPJob(100, 10, 1, "uniform", 8)
    params = 100 * 100 + 100 + 100 * 10 + 10
    assert get_estimator("deepspeed").estimate(_row(job)).peak_bytes == 20 * params

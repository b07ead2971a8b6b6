"""The declared calibration split, the context fit, and peakmem's own rows against measurements."""

from __future__ import annotations

from pathlib import Path

import pytest

from peakmem.bench.calibration import evaluation_rows, fit_context_bytes, in_calibration_split
from peakmem.datasets.rows import BenchRow

MiB = 2**20
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


def row(name: str, dataset: str = "gpumemnet-mlp1") -> BenchRow:
    return BenchRow(id="0", dataset=dataset, family="mlp", job=None, measured_peak_bytes=0,
                    status="ok", gpu="a100-40gb", torch_version="2.4.1", gpu_total_bytes=0,
                    features={"Filename": name})


def test_split_is_about_a_tenth_fixed_by_the_configuration_and_only_for_mlp1_and_cnn():
    names = [f"input:{i}_output:3_depth:2_arch:uniform_batch:8.out" for i in range(2000)]
    chosen = [n for n in names if in_calibration_split(row(n))]
    assert 150 <= len(chosen) <= 250
    assert chosen == [n for n in names if in_calibration_split(row(n))]  # deterministic
    assert not any(in_calibration_split(row(n, "gpumemnet-mlp2")) for n in names)
    assert len(evaluation_rows([row(n) for n in names])) == 2000 - len(chosen)


def test_cnn_split_stays_under_a_fifth():
    names = [f"input_channels:3_num_classes:{i}_depth:4_arch:uniform.out" for i in range(3000)]
    chosen = [n for n in names if in_calibration_split(row(n, "gpumemnet-cnn"))]
    assert 0.15 * 3000 <= len(chosen) <= 0.20 * 3000


@pytest.mark.skipif(not (SHARED / "gpumemnet").is_dir(), reason="needs ../shared/datasets")
def test_the_real_cnn_split_is_at_most_20_percent_of_the_rows():
    from peakmem.datasets.loaders import load_rows

    rows = load_rows("gpumemnet-cnn", SHARED)
    assert sum(map(in_calibration_split, rows)) <= 0.20 * len(rows)


def test_transformer_split_is_declared_and_stays_under_a_fifth():
    names = [f"num_classes:{i}_embedding_size:64_num_layers:2.out" for i in range(3000)]
    chosen = [n for n in names if in_calibration_split(row(n, "gpumemnet-transformer"))]
    assert 0.15 * 3000 <= len(chosen) <= 0.20 * 3000
    assert not any(in_calibration_split(row(n, "gpumemnet-transformer17")) for n in names)


@pytest.mark.skipif(not (SHARED / "gpumemnet").is_dir(), reason="needs ../shared/datasets")
def test_the_real_transformer_split_is_at_most_20_percent_of_the_rows():
    from peakmem.datasets.loaders import load_rows

    rows = load_rows("gpumemnet-transformer", SHARED)
    assert sum(map(in_calibration_split, rows)) <= 0.20 * len(rows)


def test_context_fit_is_the_most_common_difference_to_the_mib():
    measured = [1477, 1537, 1495, 1809, 1500]
    reserved = [48 * MiB, 108 * MiB, 64 * MiB, 376 * MiB, 51 * MiB + 300]
    # differences 1429, 1429, 1431, 1433, 1449 -> 1429
    assert fit_context_bytes(measured, reserved) == 1429 * MiB
    with pytest.raises(ValueError):
        fit_context_bytes([], [])


@pytest.mark.skipif(not (SHARED / "gpumemnet").is_dir(), reason="needs ../shared/datasets")
def test_peakmem_matches_measured_a100_mlp_rows_to_2_mib():
    from peakmem.baselines.peakmem_estimator import PeakmemEstimator
    from peakmem.datasets.loaders import load_rows

    rows = evaluation_rows(load_rows("gpumemnet-mlp1", SHARED))
    sample = rows[100:106]
    estimator = PeakmemEstimator()
    errors = [abs(estimator.estimate_bytes(r) - r.measured_peak_bytes) for r in sample]
    assert sum(e <= 2 * MiB for e in errors) >= 5, [e / MiB for e in errors]


def test_safety_margin_leaves_at_most_one_percent_of_rows_underestimated():
    from peakmem.bench.calibration import safety_margin

    # 200 rows exact, 3 under: an estimate 20% below needs 25%, 10% below 11.2%, 5% below 5.3%
    errors = [0.0] * 197 + [-0.20, -0.10, -0.05]
    # 1% of 200 = 2 rows may stay under: the third worst sets the margin (5.3% -> 5.5%)
    assert safety_margin(errors) == 0.055
    assert safety_margin([0.01, 0.2]) == 0.0  # overestimates need no margin
    assert safety_margin([]) == 0.0


def test_cnn_job_with_torchsummary_pass_matches_its_measured_a100_peak_to_the_mib():
    """A calibration-split CNN row (published: 3035 MiB on the A100). Without torchsummary's
    batch-2 pass the cuBLAS workspace lands in a freed 428 MiB activation block and splits it,
    and the simulation takes one more 428 MiB segment (3413 MiB); with it, exact."""
    from peakmem.baselines.peakmem_estimator import PeakmemEstimator

    name = ("input_channels:3_num_classes:12_depth:1_arch:uniform_base_filters:111_batch:28_"
            "input_size:190_act:tanh_dropout:0.27343464378754667_dropout:False_batchnorm:False.out")
    cnn = row(name, "gpumemnet-cnn")
    assert in_calibration_split(cnn)
    assert PeakmemEstimator().estimate_bytes(cnn) == 3035 * MiB

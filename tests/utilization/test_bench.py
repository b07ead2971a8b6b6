import json

import numpy as np
import pytest
from click.testing import CliRunner

from peakmem.baselines.gpumemnet_utilization import cross_validate_metric, utilization_bin
from peakmem.cli.main import main
from peakmem.datasets.loaders import load_rows
from peakmem.utilization.bench import bin_scores, evaluation_rows, score
from peakmem.utilization.fit import fit, residuals
from peakmem.utilization.model import ModelParams, StepOps, fitted_params
from peakmem.utilization.rows import in_fit_split, measured


def test_bins_are_thirds():
    assert [utilization_bin(v) for v in (0.0, 0.33, 1 / 3, 0.5, 0.66, 2 / 3, 1.0)] == [
        0, 0, 1, 1, 1, 2, 2
    ]


def test_bin_scores_by_hand():
    scores = bin_scores([0, 0, 0, 1], [0, 0, 1, 0])
    assert scores["accuracy"] == 0.5
    assert scores["macro_recall"] == pytest.approx((2 / 3 + 0) / 2)
    assert bin_scores([], []) == {"accuracy": None, "macro_recall": None}


def test_rows_targets_and_split(fixture_data):
    rows = load_rows("gpumemnet-mlp1", fixture_data)
    assert all(measured(r) == {"gract": 0.1, "smact": 0.1, "smocc": 0.01, "fp32a": 0.05} for r in rows)
    held_out = evaluation_rows(rows, None)
    assert held_out and not any(in_fit_split(r) for r in held_out)
    assert len(held_out) == len([r for r in rows if not in_fit_split(r)])


def test_score_reports_mae_and_baseline_side_by_side(fixture_data):
    rows = load_rows("gpumemnet-mlp1", fixture_data)[:4]
    predictions = {r.id: {"gract": 0.2, "smact": 0.1, "smocc": 0.5, "fp32a": 0.1} for r in rows}
    baseline = {m: {r.id: 0 for r in rows} for m in ("gract", "smact", "smocc", "fp32a")}
    out = score(rows, predictions, baseline)
    assert out["gract"]["model_mae"] == pytest.approx(0.1)
    assert out["smocc"]["model"]["accuracy"] == 0.0  # 0.5 is "medium", measured 0.1 "low"
    assert out["smact"]["gpumemnet"]["accuracy"] == 1.0
    assert out["gract"]["bins_measured"] == [4, 0, 0]


def test_classifier_baseline_is_out_of_fold(fixture_data):
    pytest.importorskip("sklearn")
    rows = load_rows("gpumemnet-mlp1", fixture_data)
    targets = {r.id: (0.1 if i % 2 else 0.8) for i, r in enumerate(rows)}
    cv = cross_validate_metric(rows, targets, "gpumemnet-mlp1")
    assert set(cv.predicted) == {r.id for r in rows}
    assert set(cv.predicted.values()) <= {0, 2} and len(cv.accuracy_per_fold) == 3


def _synthetic_step(gemm_flops: float) -> StepOps:
    record = {
        "version": 1,
        "ops": [["mm", "gemm", gemm_flops, 4e6, 1e6, "f32", 1], ["relu", "elem", 1e6, 8e6, 1e6, "f32", 1]],
        "phases": ["forward", "forward"],
        "syncs_before": [1, 0],
        "host_ops": 10, "host_bytes": 1000, "host_random_bytes": 0, "input_bytes": 1000,
    }
    return StepOps.from_meta(record)


def test_fit_recovers_a_known_parameter(a100):
    pytest.importorskip("scipy")
    truth = ModelParams(gemm_efficiency=0.35)
    samples = []
    for flops in (1e8, 1e9, 1e10, 3e10):
        ops = _synthetic_step(flops)
        sample = (ops, (0, False), {}, "gpumemnet-mlp1")
        from peakmem.utilization.fit import predict

        values = predict(sample, a100, truth)
        samples.append((ops, (0, False), dict(zip(("gract", "smact", "smocc", "fp32a"), values, strict=True)), "gpumemnet-mlp1"))
    fitted = fit(samples, a100, start=ModelParams())
    assert np.abs(residuals(samples, a100, fitted)).max() < 0.02


def test_shipped_parameters_are_the_fitted_file():
    params = fitted_params()
    assert params != ModelParams()  # params.toml exists and was read
    assert 0 < params.gemm_efficiency <= 1 and 0 < params.memory_efficiency <= 1


def test_cli_scores_utilization_on_fixture_rows(fixture_data, tmp_path):
    result = CliRunner().invoke(
        main,
        ["bench", "gpumemnet-mlp1", "--metric", "utilization", "--data", str(fixture_data),
         "--limit", "2", "--jobs", "1", "--json", "--cache", str(tmp_path / "steps.jsonl")],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["metric"] == "utilization" and payload["rows"] == 2
    assert payload["predicted"] == 2, payload["failures"]
    for metric in ("gract", "smact", "smocc", "fp32a"):
        assert 0 <= payload["metrics"][metric]["model_mae"] <= 1
    assert (tmp_path / "steps.jsonl").exists()


def test_cli_refuses_a_dataset_without_utilization(fixture_data):
    result = CliRunner().invoke(
        main, ["bench", "timm", "--metric", "utilization", "--data", str(fixture_data)]
    )
    assert result.exit_code == 2
    assert "utilization" in result.output


@pytest.mark.parametrize("start", ["shipped", "defaults"])
def test_fit_command_starts_where_asked(a100, monkeypatch, tmp_path, start):
    pytest.importorskip("scipy")
    import peakmem.utilization.fit as fit_module
    from peakmem.utilization.fit import predict

    truth = ModelParams(gemm_efficiency=0.35)
    samples = []
    for flops in (1e8, 1e10):
        ops = _synthetic_step(flops)
        values = predict((ops, (0, False), {}, "gpumemnet-mlp1"), a100, truth)
        samples.append((ops, (0, False), dict(zip(("gract", "smact", "smocc", "fp32a"), values, strict=True)),
                        "gpumemnet-mlp1"))
    starts = []
    real_fit = fit_module.fit
    monkeypatch.setattr(fit_module, "fit_samples", lambda *a, **k: samples)
    monkeypatch.setattr(fit_module, "fit", lambda s, g, start: starts.append(start) or real_fit(s, g, start))
    out = tmp_path / "params.toml"
    fit_module.main(["--start", start, "--out", str(out)])
    assert starts == [fitted_params() if start == "shipped" else ModelParams()]
    assert f"started from the {start} values" in out.read_text()

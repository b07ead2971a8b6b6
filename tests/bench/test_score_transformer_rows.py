"""benchmarks/score_transformer_rows.py: the fraction fitted with the reserve, and the declared
outliers reported apart (never dropped)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "score_transformer_rows.py"


@pytest.fixture(scope="module")
def score():
    spec = importlib.util.spec_from_file_location("score_transformer_rows", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(measured: float, estimated: float, segment: float, reserved: float = 1000.0) -> dict:
    error = estimated - measured
    return {"measured_mib": measured, "estimated_mib": estimated, "error_mib": error,
            "error": error / measured, "largest_gradient_segment_mib": segment,
            "peak_reserved_mib": reserved, "margin": 0.03, "margin_reserve_mib": 2 * segment}


def test_fraction_with_two_segments_covers_what_the_segments_leave(score):
    # 100 rows: one 1.5 segments under, one 2 segments + 2% of the estimate under, the rest exact
    results = {f"{i:05d}": row(1000.0, 1000.0, 10.0) for i in range(98)}
    results["a"] = row(1015.0, 1000.0, 10.0)
    results["b"] = row(1040.0, 1000.0, 10.0)
    # one row of 100 may stay under: the fraction covers the second worst
    assert score.fitted_fraction(results, 0) == pytest.approx(0.015)
    assert score.fitted_fraction(results, 2) == pytest.approx(0.0)
    del results["00000"], results["00001"]  # 98 rows: none may stay under
    assert score.fitted_fraction(results, 2) == pytest.approx(0.02)
    assert score.fitted_fraction(results, 0) == pytest.approx(0.04)


def test_declared_outliers_are_scored_and_reported_apart(score):
    outlier = score.DECLARED_OUTLIERS[0]
    results = {"00001": row(1000.0, 1000.0, 10.0), outlier: row(8743.0, 3489.0, 156.0, 2060.0)}
    assert score.exceeds_own_reserve(results[outlier])
    assert not score.exceeds_own_reserve(results["00001"])
    text = score.summary(results)
    assert text.startswith("2 rows:")  # counted in the first line
    assert "without the declared outliers" in text and "1 rows:" in text
    assert "under at the stated margin 1/2" in text


def test_an_undeclared_row_missing_more_than_its_reserve_is_named(score):
    results = {"99999": row(5000.0, 2000.0, 10.0, reserved=500.0)}
    assert "not declared: 99999" in score.summary(results)

from __future__ import annotations

import math

import pytest

from peakmem.bench.metrics import (
    RowResult,
    margin_for_failure_rate,
    required_margin,
    summarize,
    summarize_estimator,
)

MiB = 2**20
TOTAL = 1000 * MiB


def _r(i, measured_mib, est_mib, status="ok", family="a", seconds=1.0):
    return RowResult(
        str(i),
        family,
        status,
        measured_mib * MiB,
        TOTAL,
        None if est_mib is None else est_mib * MiB,
        None if est_mib is None else seconds,
    )


def test_summary_by_hand():
    rows = [
        _r(0, 100, 110, seconds=1.0),  # +10%, accurate, conserves 890
        _r(1, 200, 150, seconds=2.0),  # -25%, under, fails
        _r(2, 400, 400, seconds=3.0),  # exact, conserves 600
        _r(3, 500, 2000, status="oom", seconds=4.0),  # OOM predicted (2000 > 1000): accurate
        _r(4, 500, 900, status="oom", seconds=5.0),  # OOM missed: failure
        _r(5, 100, None),  # cannot estimate
    ]
    s = summarize(rows)
    assert s["rows"] == 6 and s["estimated"] == 5 and s["cannot_estimate"] == 1
    # relative errors over ok rows: 0.1, 0.25, 0 -> median 0.1; p90 = 0.1 + 0.8*(0.25-0.1)
    assert s["median_rel_error"] == pytest.approx(0.1)
    assert s["p90_rel_error"] == pytest.approx(0.22)
    assert s["median_abs_error_mib"] == pytest.approx(10)
    assert s["under_rate"] == pytest.approx(1 / 3)
    assert s["failure_prob"] == pytest.approx(2 / 5)
    assert s["memory_conserved_mib"] == pytest.approx((890 + 600) / 2)
    assert s["median_seconds"] == pytest.approx(3.0)


def test_margin_scales_estimates():
    rows = [_r(0, 100, 90), _r(1, 100, 100)]
    assert summarize(rows)["failure_prob"] == pytest.approx(0.5)
    with_margin = summarize(rows, margin=0.2)
    assert with_margin["failure_prob"] == 0
    assert with_margin["median_rel_error"] == pytest.approx((0.08 + 0.2) / 2)


def test_required_margin_by_hand():
    assert required_margin(_r(0, 200, 100)) == pytest.approx(1.0)
    assert required_margin(_r(0, 100, 200)) == 0
    assert required_margin(_r(0, 100, 0)) == math.inf
    # OOM row: needs est*(1+m) > total (1000 MiB)
    assert required_margin(_r(0, 600, 500, status="oom")) == pytest.approx(
        (TOTAL + 1) / (500 * MiB) - 1
    )


def test_margin_for_one_percent_failures():
    # 200 rows: required margins 0.00, 0.01, ..., 1.99 -> 2 failures allowed -> 1.97
    rows = [_r(i, 100 + i, 100) for i in range(200)]
    assert margin_for_failure_rate(rows) == pytest.approx(1.97)
    # with 50 rows no failure is allowed -> the largest need
    rows = [_r(i, 100 + i, 100) for i in range(50)]
    assert margin_for_failure_rate(rows) == pytest.approx(0.49)
    assert margin_for_failure_rate([_r(0, 100, None)]) is None


def test_estimator_summary_has_families_and_margin():
    rows = [_r(0, 100, 100, family="x"), _r(1, 100, 50, family="y")]
    s = summarize_estimator(rows, margin=1.0)
    assert set(s["families"]) == {"x", "y"}
    assert s["families"]["y"]["under_rate"] == 1
    assert s["with_margin"]["failure_prob"] == 0
    assert s["margin_for_1pct_failures"] == pytest.approx(1.0)


def test_published_xmem_table_is_reproduced(shared_data):
    """xmem/README.md's table (87 runs with a measured peak and all three estimates, Colab runs
    left out): median relative error / underestimate rate xMem 3.0% / 51%, DNNMem 20.0% / 86%,
    SchedTune 24.2% / 66%."""
    from peakmem.datasets.loaders import load_rows

    rows = [r for r in load_rows("xmem", shared_data) if r.status == "ok" and r.measured_peak_bytes]
    names = ("xMem", "DNNMem", "SchedTune")
    common = [r for r in rows if all(r.features.get(f"published:{n}") for n in names)]
    assert len(common) == 87
    published = {"xMem": (0.030, 0.51), "DNNMem": (0.200, 0.86), "SchedTune": (0.242, 0.66)}
    for name, (median, under) in published.items():
        results = [
            RowResult(
                r.id,
                r.family,
                r.status,
                r.measured_peak_bytes,
                r.gpu_total_bytes,
                int(float(r.features[f"published:{name}"]) * MiB),
                None,
            )
            for r in common
        ]
        s = summarize(results)
        assert s["median_rel_error"] == pytest.approx(median, abs=0.0015)
        assert s["under_rate"] == pytest.approx(under, abs=0.005)


def test_published_timm_faketensor_underestimates(shared_data):
    """gpumemnet/README.md: the paper's naive FakeTensor peak underestimates 4379 of 5085 timm rows
    (as measured, OOM or not); 571 rows cannot have fit the 40 GB card (bound above it)."""
    from peakmem.datasets.loaders import load_rows

    rows = load_rows("timm", shared_data)
    results = [
        RowResult(
            r.id,
            r.family,
            "ok",  # the paper's count takes every row as measured
            r.measured_peak_bytes,
            r.gpu_total_bytes,
            int(float(r.features["faketensor_mib"]) * MiB),
            None,
        )
        for r in rows
    ]
    s = summarize(results)
    assert len(rows) == 5085
    assert round(s["under_rate"] * len(rows)) == 4379
    assert sum(r.status == "oom" for r in rows) == 571


def test_within_2_mib_share_and_underestimates_beyond_it():
    from peakmem.bench.metrics import RowResult, summarize

    mib = 2**20

    def r(measured_mib, estimate_mib):
        return RowResult(row_id="x", family="f", status="ok", measured_bytes=measured_mib * mib,
                         gpu_total_bytes=40960 * mib, estimate_bytes=estimate_mib * mib,
                         seconds=0.1, error=None)

    # exact, 2 MiB under (still "exact"), 3 MiB under, 5 MiB over
    s = summarize([r(1000, 1000), r(1000, 998), r(1000, 997), r(1000, 1005)])
    assert s["within_2mib_share"] == 0.5
    assert s["under_rate"] == 0.5
    assert s["under_beyond_2mib_rate"] == 0.25


def test_stated_margin_scales_each_row_by_its_own_margin():
    from peakmem.bench.metrics import RowResult, summarize_estimator

    def row(i, est, meas, margin):
        return RowResult(row_id=str(i), family="f", status="ok", measured_bytes=meas,
                         gpu_total_bytes=10**9, estimate_bytes=est, seconds=0.1,
                         stated_margin=margin)

    # under by 10% with a 20% margin: covered; under by 10% with a 5% margin: still a failure
    results = [row(0, 90, 100, 0.20), row(1, 90, 100, 0.05), row(2, 100, 100, 0.0)]
    summary = summarize_estimator(results, margin=0.1)
    assert summary["failure_prob"] == pytest.approx(2 / 3)
    assert summary["with_stated_margin"]["failure_prob"] == pytest.approx(1 / 3)
    plain = [RowResult(**{**r.to_json(), "stated_margin": None}) for r in results]
    assert "with_stated_margin" not in summarize_estimator(plain, margin=0.1)

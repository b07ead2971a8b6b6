"""benchmarks/transformer_tail.py: the under-estimated Transformer rows sorted into whole
largest-gradient segments and amounts shared by unrelated jobs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "transformer_tail.py"


@pytest.fixture(scope="module")
def tail():
    spec = importlib.util.spec_from_file_location("transformer_tail", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["transformer_tail"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def result(measured: float, error: float, segment: float) -> dict:
    return {"measured_mib": measured, "estimated_mib": measured + error, "error_mib": error,
            "error": error / measured, "largest_gradient_segment_mib": segment}


def test_campaign_boundary_is_the_first_step2_page(tail):
    assert tail.campaign_of(0) == "step 1"
    assert tail.campaign_of(4_216_192) == "step 1"  # the page of rows 00528-00532
    assert tail.campaign_of(4_285_310) == "step 2"  # row 00533 on


def test_whole_segments_within_16_mib_or_3_percent(tail):
    assert tail.whole_segments(4302.0, 4302.0) == 1
    assert tail.whole_segments(228.0, 228.0) == 1
    assert tail.whole_segments(306.0, 292.0) == 1  # 14 MiB off
    assert tail.whole_segments(1512.0, 764.0) == 2  # 16 MiB off two segments
    assert tail.whole_segments(1042.0, 2332.0) is None
    assert tail.whole_segments(416.0, 592.0) is None
    assert tail.whole_segments(3000.0, 2994.0) == 1  # 6 MiB off, inside 3% of a large segment
    assert tail.whole_segments(100.0, 0.0) is None


def test_the_same_amount_missed_by_jobs_of_different_sizes_is_shared(tail):
    results = {
        "a": result(6835.0, -1512.0, 764.0),
        "b": result(10895.0, -1512.0, 922.0),
        "c": result(14637.0, -1520.0, 1786.0),
        "d": result(3451.0, -228.0, 228.0),
        "e": result(9000.0, -1515.0, 770.0),  # same amount, but a segment within 10% of a's
        "f": result(5000.0, -50.0, 500.0),  # under the threshold
        "g": {"error": "RuntimeError: x"},
    }
    rows = {t.row_id: t for t in tail.tail_rows(results, {}, min_mib=100.0)}
    assert set(rows) == {"a", "b", "c", "d", "e"}
    assert rows["a"].shared_with == ["b", "c"]  # not e: its segment is a's size
    assert rows["b"].shared_with == ["a", "c", "e"]
    assert rows["d"].shared_with == [] and rows["d"].whole_segments == 1
    assert rows["d"].kind == "1 x segment"
    assert rows["a"].kind.startswith("2 x segment; shared ~1512")
    assert [t.row_id for t in tail.tail_rows(results, {}, 100.0)][0] == "c"  # worst first


def test_campaign_counts_and_table(tail):
    results = {"00001": result(1000.0, -300.0, 300.0), "00600": result(1000.0, 0.0, 300.0),
               "00601": result(1000.0, -2.0, 300.0)}
    offsets = {"00001": 100, "00600": 5_000_000, "00601": 5_000_000}
    rows = tail.tail_rows(results, offsets)
    assert tail.campaign_counts(results, offsets, rows) == {"step 1": (1, 1), "step 2": (2, 0)}
    text = tail.table(rows, {"00001": "up +280, down +0"})
    assert "| 00001 | step 1 |" in text and "| 1.00 | 1 x segment | up +280, down +0 |" in text


def test_over_rows_are_classified_the_same_way(tail):
    results = {"00165": result(20000.0, 1970.0, 1970.0), "00001": result(1000.0, -300.0, 300.0)}
    rows = tail.tail_rows(results, {}, over=True)
    assert [(t.row_id, t.deficit_mib, t.kind) for t in rows] == [("00165", 1970.0, "1 x segment")]


def test_layout_reserve_counts_rows_still_under(tail):
    results = {"a": result(1000.0, -100.0, 100.0), "b": result(1000.0, 0.0, 100.0),
               "c": result(1000.0, -50.0, 100.0), "d": result(1000.0, -500.0, 100.0)}
    probes = {"a": {"up_mib": 80.0, "down_mib": 0.0}, "b": {"up_mib": 0.0, "down_mib": 0.0},
              "c": {"up_mib": 0.0, "down_mib": 0.0}}  # d not probed: not counted
    # a: 900 x 1.03 + 80 = 1007 (covered); b: 1030; c: 950 x 1.03 = 978.5 (under)
    under, counted, median = tail.under_with_layout_reserve(results, probes, 0.03)
    assert (under, counted) == (1, 3)
    assert median == pytest.approx(0.007)


def test_a_constant_covers_what_the_fraction_would_otherwise_have_to(tail):
    results = {f"{i:05d}": result(1000.0, 0.0, 100.0) for i in range(99)}
    results["x"] = result(1000.0, -400.0, 100.0)  # 400 MiB under an estimate of 600
    assert tail.fitted_fraction(results, 0, 0.0) == 0.0  # one row of 100 may stay under
    del results["00000"]  # 99 rows: none may
    assert tail.fitted_fraction(results, 0, 0.0) == pytest.approx(400 / 600, abs=0.005)
    assert tail.fitted_fraction(results, 1, 300.0) == 0.0
    assert tail.fitted_fraction(results, 0, 300.0) == pytest.approx(0.17, abs=0.005)
    lines = tail.scan_margins(results, results, constants=(0, 300), most_segments=1)
    assert lines[2].startswith("| 0 | 0 | 67.0% | 0/99 |")
    assert lines[5].startswith("| 1 | 300 | 0.0% | 0/99 |")

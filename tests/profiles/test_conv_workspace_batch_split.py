"""The workspace table's fallback past the grid's largest batch: its linear-in-batch answer on a
hand-made table, and the grid's declared batch split (n <= 32 answers n = 64) on which no
extrapolation candidate beat it (docs/cnn.md "Past the grid's batch sizes")."""

import pytest

from peakmem.profiles.conv_workspace_batch_split import (
    FIT_SPLIT,
    TEST_SPLIT,
    pair_exponents,
    score_split,
    worst_under,
)
from peakmem.profiles.conv_workspace_table import ConvShape, Measured, WorkspaceTable, load_table

TABLE = "cudnn_workspace/sm90_cudnn91900_torch-2.11.csv.gz"


def layer(n, cout=64):
    return ConvShape(n, 64, 56, 56, cout, 3, 1, 1, 1, 1, "tf32", "nchw")


def hand_table():
    """Five measured layers (64 -> 56..72 channels, 3x3 at 56x56) at batch 8..32, each taking
    2 x (x + y + w) forward, and one at batch 32 taking half of that."""
    cases = [Measured(layer(n, cout), "Cudnn", {"forward": 2 * layer(n, cout).tensor_bytes})
             for n, cout in ((8, 64), (16, 64), (32, 64), (32, 56), (32, 72))]
    cases.append(Measured(layer(32, 80), "Cudnn", {"forward": layer(32, 80).tensor_bytes}))
    return WorkspaceTable(cases)


def test_fallback_is_linear_in_the_batch_past_the_largest_measured():
    table = hand_table()
    for n in (64, 128, 256):  # x + y + w of 64 -> 64 at 56x56 fp32: n x 1.6 MB + 147 kB
        assert table.lookup(layer(n), "forward").how == "nearest"
        assert table.nearest(layer(n), "forward") == pytest.approx(2 * layer(n).tensor_bytes, abs=1)
    # The candidates the split scored: each neighbour's ratio x (n / its n) ** exponent ...
    n32 = 2 * layer(128).tensor_bytes * 4  # the batch-32 neighbours' ratio x (128 / 32)
    assert table.nearest(layer(128), "forward", batch_exponent=1.0) == pytest.approx(n32, rel=1e-6)
    # ... and a higher quantile of the neighbours' ratios (all 2 here but the batch-32 80-channel
    # one at 1: the median and 0.9 take 2, and the lowest takes 1).
    assert table.nearest(layer(128), "forward", quantile=0.0) == layer(128).tensor_bytes
    assert table.nearest(layer(128), "forward", quantile=0.9) == 2 * layer(128).tensor_bytes


@pytest.fixture(scope="module")
def grid():
    return load_table(TABLE)


def test_the_grid_scales_workspace_like_x_y_w_in_the_batch(grid):
    exponents = pair_exponents(grid)
    assert abs(exponents["forward"]) < 0.01 and abs(exponents["backward_data"]) < 0.01
    assert -0.1 < exponents["backward_weight"] < 0


def test_todays_fallback_on_the_grids_batch_split(grid):
    """n <= 32 answers the 548 cuDNN n = 64 cases: medians ~0, p90 55 / 69 / 116% of x + y + w,
    11 / 14 / 32% under; 40 GiB under against 17 GiB over in all."""
    scores = {s.direction: s for s in score_split(grid, TEST_SPLIT)}
    assert {s.cases for s in scores.values()} == {548}
    assert scores["forward"].median < 0.001 and scores["backward_weight"].median == pytest.approx(0.054, abs=0.002)
    assert [round(scores[d].p90, 2) for d in scores] == [0.55, 0.69, 1.16]
    assert [round(scores[d].share_under, 3) for d in scores] == [0.111, 0.137, 0.316]
    under = sum(s.under_bytes for s in scores.values())
    over = sum(s.over_bytes for s in scores.values())
    assert 39 * 2**30 < under < 41 * 2**30 and 16 * 2**30 < over < 17 * 2**30


@pytest.mark.parametrize("quantile, exponent", [(0.75, 0.0), (0.5, 0.2)])
def test_candidates_trade_underestimates_for_a_worse_p90(grid, quantile, exponent):
    """Why the rule keeps the median: on the evaluation split each candidate answers fewer
    cases under but its p90 is worse in every direction, and on the choosing split (n <= 16
    answers n = 32) it adds more GiB over than it removes under."""
    today = score_split(grid, TEST_SPLIT)
    other = score_split(grid, TEST_SPLIT, quantile, exponent)
    for base, cand in zip(today, other, strict=True):
        assert cand.share_under < base.share_under and cand.p90 > base.p90
    fit_today = score_split(grid, FIT_SPLIT)
    fit_other = score_split(grid, FIT_SPLIT, quantile, exponent)
    removed = sum(s.under_bytes for s in fit_today) - sum(s.under_bytes for s in fit_other)
    added = sum(s.over_bytes for s in fit_other) - sum(s.over_bytes for s in fit_today)
    assert 0 < removed < added


def test_the_bytes_under_are_a_few_large_engine_switches(grid):
    """20 of the 1644 answers make 62% of the bytes under; the worst: a grouped 5x5 layer at
    224x224 whose forward takes 2.67 x (x + y + w) at batch 64, answered 0.21 x."""
    rows = worst_under(grid, TEST_SPLIT, 20)
    assert sum(row[-1] for row in rows) == pytest.approx(0.62, abs=0.01)
    _under, direction, shape, truth, guess, _share = rows[0]
    assert (direction, shape.cin, shape.h, shape.kernel, shape.groups) == ("forward", 64, 224, 5, 32)
    assert round(truth, 2) == 2.67 and round(guess, 2) == 0.21

from __future__ import annotations

import pytest

from peakmem.baselines import ESTIMATORS, CannotEstimate, EstimatorUnavailable, get_estimator
from peakmem.bench.rows import BenchRow


def test_issue_names_are_registered():
    assert set(ESTIMATORS) == {
        "peakmem",
        "horus",
        "faketensor",
        "gpumemnet",
        "accelerate",
        "deepspeed",
    }


def test_unknown_estimator_lists_known_ones():
    with pytest.raises(KeyError, match="known: peakmem, horus"):
        get_estimator("oracle")


def test_peakmem_is_not_available_yet_but_others_are():
    with pytest.raises(EstimatorUnavailable, match="estimator 'peakmem' is not available yet"):
        get_estimator("peakmem")
    for name in ESTIMATORS:
        if name != "peakmem":
            assert get_estimator(name).name == name


@pytest.mark.parametrize("name", ["horus", "faketensor", "accelerate", "deepspeed", "gpumemnet"])
def test_rows_without_a_rebuildable_job_raise_cannot_estimate(name):
    row = BenchRow(
        "0",
        "xmem",
        "VGG16",
        {"model": "VGG16", "batch_size": 8},
        1,
        "ok",
        "rtx3060-12gb",
        "2.6.0",
        12 * 2**30,
    )
    estimator = get_estimator(name)
    estimator.prepare([row])
    with pytest.raises(CannotEstimate):
        estimator.estimate(row)

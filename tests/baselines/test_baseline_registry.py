from __future__ import annotations

import pytest

from peakmem.baselines import ESTIMATORS, CannotEstimate, get_estimator
from peakmem.datasets.rows import BenchRow


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


def test_every_registered_estimator_is_available():
    for name in ESTIMATORS:
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

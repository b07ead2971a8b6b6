"""The bench worker freezes its start-up objects out of the garbage collector
(`freeze_start_up_objects`): the estimates are the same, every figure and trace event."""

import gc
from pathlib import Path

import pytest

from peakmem.baselines.peakmem_estimator import PeakmemEstimator
from peakmem.bench.calibration import evaluation_rows
from peakmem.bench.runner import freeze_start_up_objects
from peakmem.datasets.loaders import load_rows, spread_subset

DATA = Path("/work/shared/datasets")
if not (DATA / "gpumemnet").is_dir():
    DATA = Path(__file__).resolve().parents[3] / "shared" / "datasets"

pytestmark = pytest.mark.skipif(not (DATA / "gpumemnet").is_dir(), reason="no datasets")


def whole(estimate):
    data = estimate.to_json()
    data.pop("seconds", None)
    trace = estimate.capture.trace
    data["trace"] = [list(trace.kinds), list(trace.ids), list(trace.sizes), list(trace.streams),
                     [None if t is None else t.to_json() for t in map(trace.tag_of, range(len(trace)))]]
    data["meta"] = trace.meta
    return data


def estimates(rows, collections):
    """Each row's whole estimate, a full collection forced every `collections` ops of the run
    (None: the collector's own schedule)."""
    from peakmem.capture import recorder

    original = recorder.AllocationRecorder._dispatch
    calls = [0]

    def collecting(self, func, args, kwargs):
        calls[0] += 1
        if collections and calls[0] % collections == 0:
            gc.collect()
        return original(self, func, args, kwargs)

    recorder.AllocationRecorder._dispatch = collecting
    try:
        return [whole(PeakmemEstimator().run(row)) for row in rows]
    finally:
        recorder.AllocationRecorder._dispatch = original


def test_frozen_start_up_and_collection_timing_leave_the_estimates_alone():
    rows = spread_subset(evaluation_rows(load_rows("gpumemnet-cnn", DATA)), 40)[:3]
    before = estimates(rows, None)
    try:
        assert freeze_start_up_objects() > 100_000  # torch's modules and functions at least
        frozen = estimates(rows, None)
        # collecting far more often (every 97 ops) moves no event either: each collection goes
        # through the job's own objects (start-up ones frozen, as in the bench worker, so that
        # ~60 full collections do not each walk torch's modules)
        collected = estimates(rows, 97)
    finally:
        gc.unfreeze()
    assert frozen == before
    assert collected == before

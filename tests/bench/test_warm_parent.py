"""The bench's pool forks its workers warm (bench/runner.py `warm_parent`): with the "fork"
start method the parent runs the first row itself, as a worker would, and the workers forked
after it start with what that row imported and cached. The rows' results are those of the
serial run, each row estimated once."""

import os

import pytest

from peakmem.baselines.base import Estimate, Estimator
from peakmem.bench import runner
from peakmem.bench.runner import ResultCache, run_estimators
from peakmem.datasets.rows import BenchRow

pytestmark = pytest.mark.skipif(not runner.forks_warm_workers(), reason="no fork start method")

_RAN_HERE: list[str] = []
"""Rows this process (or the process it was forked from, before the fork) estimated."""


class Remembering(Estimator):
    """Its estimate is the row's number x 10; `seconds` carries how many rows the process had
    already seen (inherited through a fork too) and `stated_margin` the process id."""

    name = "remembering"

    def estimate(self, row):
        seen = len(_RAN_HERE)
        _RAN_HERE.append(row.id)
        return Estimate(int(row.id) * 10, float(seen), stated_margin=float(os.getpid()))


def _rows(count):
    return [BenchRow(id=str(i), dataset="d", family="f", job=None, measured_peak_bytes=40,
                     status="ok", gpu="a100-40gb", torch_version="2.4.1", gpu_total_bytes=80)
            for i in range(1, count + 1)]


@pytest.fixture
def worker_state(monkeypatch):
    """The parent's worker set-up without its process-wide effects on the test process: no
    freeze of the collector's objects; torch's thread count put back."""
    import torch

    threads = torch.get_num_threads()
    monkeypatch.setattr(runner, "freeze_start_up_objects", lambda: 0)
    monkeypatch.setattr(runner, "_WORKER_ROWS", [0])
    monkeypatch.setattr(runner, "_WORKER_ESTIMATORS", {})
    _RAN_HERE.clear()
    yield
    _RAN_HERE.clear()
    torch.set_num_threads(threads)


def _run(rows, jobs):
    done = []
    cache = ResultCache(None)
    results = run_estimators({"remembering": Remembering()}, rows, dataset="d", cache=cache,
                             jobs=jobs, on_result=lambda: done.append(1))["remembering"]
    return results, len(done), cache


def test_the_parent_runs_the_first_row_and_forks_the_workers_warm(worker_state):
    rows = _rows(6)
    serial, _, _ = _run(rows, jobs=1)
    _RAN_HERE.clear()
    parallel, reported, cache = _run(rows, jobs=2)
    assert [r.estimate_bytes for r in parallel] == [r.estimate_bytes for r in serial] == [
        10, 20, 30, 40, 50, 60]
    assert reported == 6 and all(
        cache.get(runner.cache_key("d", runner.estimator_tag("remembering", Remembering(), 6),
                                   row.id)) is not None for row in rows)
    first, rest = parallel[0], parallel[1:]
    assert first.stated_margin == os.getpid() and first.seconds == 0  # here, first of all
    assert _RAN_HERE == ["1"]  # the workers' rows ran in the workers
    assert all(r.stated_margin != os.getpid() for r in rest)
    # each worker started from the parent after its row: the row is in what it inherited
    assert all(r.seconds >= 1 for r in rest)
    assert runner._WORKER_ROWS == [1]  # counted as a worker's row (its refreeze schedule)


def test_without_fork_the_workers_start_cold(worker_state, monkeypatch):
    monkeypatch.setattr(runner, "forks_warm_workers", lambda: False)
    rows = _rows(6)
    parallel, reported, _ = _run(rows, jobs=2)
    assert [r.estimate_bytes for r in parallel] == [10, 20, 30, 40, 50, 60] and reported == 6
    assert _RAN_HERE == [] and all(r.stated_margin != os.getpid() for r in parallel)
    # a worker's first row saw no row before it (two workers: at least one such row each)
    assert sum(r.seconds == 0 for r in parallel) >= 1

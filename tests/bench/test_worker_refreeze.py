"""A bench worker freezes what is alive again after its 1st, 2nd, 4th, 8th, ... row
(`after_worker_row`), so the objects its first rows import and cache are not walked by every
later full collection. (tests/bench/test_worker_gc.py: the estimates do not depend on it.)"""

import gc

from peakmem.bench import runner


def test_the_worker_refreezes_after_rows_at_powers_of_two(monkeypatch):
    monkeypatch.setattr(runner, "_WORKER_ROWS", [0])
    kept = []
    refrozen = []
    try:
        for _ in range(9):
            kept.append([[i] for i in range(100)])  # alive past the row: 101 tracked lists
            before = gc.get_freeze_count()
            refrozen.append(runner.after_worker_row())
            if refrozen[-1]:
                assert gc.get_freeze_count() >= before + 100  # this row's objects, at least
            else:  # nothing frozen (a frozen object freed meanwhile leaves the count lower)
                assert gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()
    assert refrozen == [True, True, False, True, False, False, False, True, False]


def test_work_counts_the_row(monkeypatch):
    monkeypatch.setattr(runner, "_WORKER_ROWS", [0])
    calls = []
    monkeypatch.setattr(runner, "estimate_row", lambda estimator, row: ("result", row))
    monkeypatch.setattr(runner, "freeze_start_up_objects", lambda: calls.append(1) or 0)
    monkeypatch.setitem(runner._WORKER_ESTIMATORS, "stub", object())
    assert runner._work("stub", "row-a") == ("stub", ("result", "row-a"))
    assert runner._work("stub", "row-b") == ("stub", ("result", "row-b"))
    assert runner._work("stub", "row-c") == ("stub", ("result", "row-c"))
    assert calls == [1, 1]

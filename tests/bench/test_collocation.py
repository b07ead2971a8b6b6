from __future__ import annotations

import numpy as np

from peakmem.bench.collocation import (
    PAI_MIN_BYTES,
    Job,
    pack_first_fit,
    pai_like_sizes,
    simulate_estimators,
    stream_from_sizes,
)


def test_first_fit_by_hand():
    # capacity 10: estimates 6,5,4,3,12 -> GPU0 {6,4}, GPU1 {5,3}; 12 rejected
    jobs = [Job(7, 6), Job(5, 5), Job(4, 4), Job(3, 3), Job(1, 12)]
    result = pack_first_fit(jobs, 10)
    assert result.gpus_used == 2 and result.rejected == 1 and result.placed == 4
    # GPU0 real = 7 + 4 = 11 > 10 -> OOM hitting 2 jobs; GPU1 real = 8 -> 2 idle
    assert result.oom_gpus == 1 and result.jobs_oom == 2
    assert result.idle_bytes == 2 and result.idle_fraction == 0.2


def test_exact_estimates_never_oom():
    rng = np.random.default_rng(1)
    peaks = rng.integers(1, 100, 300)
    result = pack_first_fit([Job(int(p), int(p)) for p in peaks], 100)
    assert result.oom_gpus == 0 and result.rejected == 0


def test_pai_like_sizes_are_clipped_and_reproducible():
    peaks, plan = pai_like_sizes(5000, 40 * 2**30, seed=3)
    again, _ = pai_like_sizes(5000, 40 * 2**30, seed=3)
    assert (peaks == again).all()
    assert peaks.min() >= PAI_MIN_BYTES and peaks.max() <= 40 * 2**30
    assert 1.5 * 2**30 < np.median(peaks) < 2.5 * 2**30
    assert set(np.unique(plan)) <= {25, 50, 100}


def test_underestimating_estimator_causes_ooms_oracle_does_not():
    peaks = [30] * 20
    results = simulate_estimators(peaks, {"half": [0.5], "double": [2.0]}, 100)
    assert results["oracle"].oom_gpus == 0 and results["oracle"].gpus_used == 7
    assert results["half"].oom_gpus > 0
    assert results["double"].oom_gpus == 0 and results["double"].gpus_used == 20
    assert [j.estimate_bytes for j in stream_from_sizes([10, 20], [1.5])] == [15, 30]

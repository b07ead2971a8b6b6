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


def test_bench_packs_with_the_schedule_placement():
    # the bench's placement is peakmem pack's: same bins for the same estimates
    from peakmem.bench.collocation import pack_jobs
    from peakmem.schedule.pack import assign

    sizes = [6, 5, 4, 3, 7, 2]
    jobs = [Job(s, s) for s in sizes]
    for policy in ("first-fit", "best-fit-decreasing"):
        where = assign(sizes, [10] * len(sizes), policy)
        assert pack_jobs(jobs, 10, policy).gpus_used == len({b for b in where if b is not None})
    # 7+3, 6+4, 5+2: best-fit-decreasing needs 3 GPUs, first-fit 3 too (6+4, 5+3+2, 7)
    assert pack_jobs(jobs, 10, "best-fit-decreasing").gpus_used == 3


def test_dataset_section_reports_margin_and_user_request_rows():
    from peakmem.bench.metrics import RowResult
    from peakmem.bench.report import dataset_collocation_section

    def row(i, measured, estimate, margin=None):
        return RowResult(f"r{i}", "mlp", "ok", measured, 100, estimate, 1.0, stated_margin=margin)

    results = {"peakmem": [row(i, 30, 29, 0.1) for i in range(6)]}
    text = dataset_collocation_section(results, 100)
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("|")}
    # 29-byte estimates pack 3 per GPU: 90 real bytes each, no OOM; with the +10% margin still 3
    assert "| oracle | 2 | 1.00x |" in lines["oracle"]
    assert "| peakmem + margin | 2 |" in lines["peakmem + margin"]
    user = lines["whole GPU per job (user request)"]
    assert user == "| whole GPU per job (user request) | 6 | 3.00x | 0 | 0 | 0 | 70.0% |"

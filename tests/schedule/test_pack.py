from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peakmem.schedule.inventory import Bin, parse_inventory
from peakmem.schedule.jobs import job_from_estimate
from peakmem.schedule.pack import (
    MARGIN_FAILURE_RATE,
    PackError,
    PackJob,
    assign,
    pack,
    what_if,
)


def jobs(*sizes, smact=None):
    return [
        PackJob(f"j{i}", s, failure_rate=0.01, smact=None if smact is None else smact[i])
        for i, s in enumerate(sizes)
    ]


def bins(*capacities):
    return [Bin("x", i, c) for i, c in enumerate(capacities)]


def test_first_fit_by_hand():
    # capacity 10 each: 6 -> 0, 5 -> 1 (0 has 4 left), 4 -> 0, 3 -> 1, 12 fits nowhere
    assert assign([6, 5, 4, 3, 12], [10] * 5, "first-fit") == [0, 1, 0, 1, None]
    # first-fit takes the first bin in inventory order, even a bigger one
    assert assign([5, 6, 4], [24, 10, 10, 40], "first-fit") == [0, 0, 0]
    # a small first bin skipped by a big job is still first for a small one
    assert assign([8, 3], [5, 10], "first-fit") == [1, 0]


def test_best_fit_decreasing_by_hand():
    # order 6, 5, 4: 6 -> smallest unused bin that holds it (bin 1, 4 left); 5 -> bin 2 (5 left);
    # 4 -> used bin it fills best (bin 1: 0 left)
    assert assign([5, 6, 4], [24, 10, 10, 40], "best-fit-decreasing") == [2, 1, 1]
    # 7, 5, 3, 3, 2 on 10s: 7 -> 0; 5 -> 1; 3 -> 0 (full); 3 -> 1 (2 left); 2 -> 1 (full)
    assert assign([3, 7, 2, 5, 3], [10] * 5, "best-fit-decreasing") == [0, 0, 1, 1, 1]


def test_best_fit_uses_fewer_gpus_than_first_fit_here():
    sizes = [2, 5, 4, 7, 1, 3, 8]  # 30 units: 3 bins of 10 suffice
    ff = {b for b in assign(sizes, [10] * 7, "first-fit")}
    bfd = {b for b in assign(sizes, [10] * 7, "best-fit-decreasing")}
    assert len(bfd) == 3 and len(ff) == 4


def test_utilization_aware_keeps_sm_activity_under_the_limit():
    js = jobs(3, 3, 3, smact=[0.6, 0.5, 0.3])
    placement = pack(js, bins(10, 10), "utilization-aware", max_smact=1.0)
    # memory alone would put all three on one GPU; SM activity 0.6 + 0.5 > 1
    groups = sorted(sorted(j.name for j in b.jobs) for b in placement.bins)
    assert groups == [["j0", "j2"], ["j1"]]
    assert all(b.smact <= 1.0 for b in placement.bins)
    assert pack(js, bins(10, 10), "best-fit-decreasing").bins[0].jobs == js


def test_utilization_aware_mig_slice_offers_its_share_of_sms():
    slice_ = parse_inventory("a100-40gb/3g.20gb")  # 3/7 of the SMs
    js = [PackJob("a", 10, smact=0.5)]
    assert pack(js, slice_, "utilization-aware").rejected
    assert not pack([PackJob("a", 10, smact=0.4)], slice_, "utilization-aware").rejected


def test_utilization_aware_refuses_estimates_without_smact():
    with pytest.raises(PackError, match="utilization.smact") as info:
        pack(jobs(3, 3), bins(10), "utilization-aware")
    assert info.value.exit_code == 3


def test_unknown_policy():
    with pytest.raises(PackError, match="first-fit, best-fit-decreasing"):
        pack(jobs(1), bins(10), "worst-fit")


def test_rejections_say_why():
    placement = pack(jobs(12, 6, 6), bins(10), "first-fit")
    reasons = {job.name: why for job, why in placement.rejected}
    assert "largest GPU or slice of the inventory holds" in reasons["j0"]
    assert "inventory is full" in reasons["j2"]
    assert [b.index for b in placement.bins] == [0]
    assert pack(jobs(1), [], "first-fit").rejected[0][1] == "the inventory is empty"


def test_json_contract():
    placement = pack(jobs(6, 5, 4), bins(10, 10), "first-fit")
    data = placement.to_json()
    assert set(data) >= {"gpus", "rejected"}
    first = data["gpus"][0]
    assert {k: first[k] for k in ("gpu", "index", "jobs", "bytes_with_margin", "capacity_bytes")} == {
        "gpu": "x", "index": 0, "jobs": ["j0", "j2"], "bytes_with_margin": 10, "capacity_bytes": 10,
    }
    assert data["rejected"] == []


def test_oom_risk_from_calibrated_failure_rates():
    placement = pack(jobs(1, 1, 1), bins(10, 10), "first-fit")
    (load,) = placement.bins
    assert load.oom_risk == pytest.approx(1 - 0.99**3)
    assert placement.expected_oom_bins == pytest.approx(1 - 0.99**3)
    unknown = pack([PackJob("a", 1, failure_rate=None)], bins(10), "first-fit")
    assert unknown.bins[0].oom_risk is None and unknown.to_json()["oom_risk_any"] is None
    assert any("OOM risk of their GPUs is unknown" in n for n in unknown.notes)


def test_job_from_estimate():
    est = {"peak_bytes": 100, "peak_bytes_with_margin": 101.2, "safety_margin": 0.015, "gpu": "l4",
           "utilization": {"smact": 0.4}}
    job = job_from_estimate("a.json", est)
    assert job.bytes_with_margin == 102 and job.failure_rate == MARGIN_FAILURE_RATE
    assert job.smact == 0.4 and job.gpu == "l4"
    assert job_from_estimate("b", {"peak_bytes": 5, "safety_margin": 0}).failure_rate is None
    for bad in ({"error": {"message": "boom"}}, {"peak_bytes": -1}, {"peak_bytes": "7"}, [1],
                {"peak_bytes": float("nan")}, {"peak_bytes": 1, "utilization": {"smact": 3}}):
        with pytest.raises(PackError):
            job_from_estimate("bad", bad)


def test_what_if_picks_the_cheapest_single_type():
    G = 2**30
    js = jobs(30 * G, 30 * G, 50 * G)
    answers = what_if(js, ["a100-40gb", "a100-80gb", "h200"])
    by_gpu = {a.gpu: a for a in answers}
    assert by_gpu["a100-40gb"].count is None and [j.name for j, _ in by_gpu["a100-40gb"].rejected] == ["j2"]
    assert by_gpu["a100-80gb"].count == 2  # 50 + 30 > 79.3 GiB: 50 | 30 + 30
    assert by_gpu["h200"].count == 1
    assert answers[-1].gpu == "a100-40gb"  # one that cannot hold every job comes last


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 100), max_size=30),
    capacities=st.lists(st.integers(1, 120), max_size=8),
    policy=st.sampled_from(["first-fit", "best-fit-decreasing"]),
)
def test_assign_invariants(sizes, capacities, policy):
    where = assign(sizes, capacities, policy)
    used = [0] * len(capacities)
    for size, b in zip(sizes, where, strict=True):
        if b is not None:
            used[b] += size
    assert all(u <= c for u, c in zip(used, capacities, strict=True))  # never over capacity
    for size, b in zip(sizes, where, strict=True):
        if b is None:  # rejected only when no bin had room (room only shrinks)
            assert all(c - u < size for u, c in zip(used, capacities, strict=True))

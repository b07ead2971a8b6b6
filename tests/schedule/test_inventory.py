from __future__ import annotations

import pytest

from peakmem.profiles import load_gpu
from peakmem.schedule.inventory import InventoryError, parse_inventory
from peakmem.schedule.mig import load_mig, mig_profiles, smallest_fitting


def test_whole_gpus_counts_and_aliases():
    bins = parse_inventory("2xa100-40gb, l4 ,3Xh100-80gb")
    assert [b.gpu for b in bins] == ["a100-40gb"] * 2 + ["l4"] + ["h100-80gb"] * 3
    assert [b.device for b in bins] == [0, 1, 2, 3, 4, 5]
    assert all(b.mig is None for b in bins)
    assert bins[0].capacity_bytes == load_gpu("a100-40gb").total_memory_bytes
    assert parse_inventory("a100")[0].gpu == "a100-40gb"  # alias


def test_slices_of_one_profile_fill_gpus_by_instance_limit():
    bins = parse_inventory("9xa100-80gb/1g.10gb")
    assert len(bins) == 9 and {b.mig for b in bins} == {"1g.10gb"}
    # at most 7 instances of 1g.10gb per GPU: 7 on device 0, 2 on device 1
    assert [b.device for b in bins] == [0] * 7 + [1] * 2
    assert parse_inventory("9xa100-80gb/1g.10gb,l4")[-1].device == 2
    assert bins[0].label == "a100-80gb/1g.10gb"


def test_partitioned_gpus():
    bins = parse_inventory("2xh100-80gb:3g.40gb+2g.20gb+1g.10gb")
    assert [(b.device, b.mig) for b in bins] == [
        (0, "3g.40gb"), (0, "2g.20gb"), (0, "1g.10gb"),
        (1, "3g.40gb"), (1, "2g.20gb"), (1, "1g.10gb"),
    ]
    assert parse_inventory("a100-40gb:3g.20gb")[0].capacity_bytes == 20 * 10**9


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "empty"),
        ("l4,,l4", "empty item"),
        ("foo", "unknown GPU"),
        ("0xl4", "between 1 and"),
        ("l4/1g.5gb", "no MIG profiles"),
        ("a100-40gb/1g.10gbx", "no MIG profile"),
        ("a100-40gb:7g.40gb+1g.5gb", "at most 7/7"),
        ("a100-40gb:4g.20gb+4g.20gb", "at most 7/7"),
        ("a100-80gb:1g.20gb+1g.20gb+1g.20gb+1g.20gb+1g.20gb", "at most"),
        ("a100-40gb:3g.20gb+3g.20gb+3g.20gb", "at most"),
        ("200000xl4", "between 1 and"),
    ],
)
def test_bad_inventories_say_why(text, says):
    with pytest.raises(InventoryError, match=says):
        parse_inventory(text)


def test_mig_capacities_never_exceed_the_slice():
    # the name's decimal GB, capped by the guide's fraction of the GPU's memory
    a100 = load_gpu("a100-40gb")
    assert load_mig(a100, "1g.5gb").capacity_bytes == 5 * 10**9
    assert load_mig(a100, "7g.40gb").capacity_bytes == min(40 * 10**9, a100.total_memory_bytes)
    for gpu in ("a100-40gb", "a100-80gb", "h100-80gb", "h200"):
        total = load_gpu(gpu).total_memory_bytes
        for mig in mig_profiles(gpu):
            assert mig.capacity_bytes <= total * mig.memory_eighths // 8
    assert mig_profiles("l4") == []


def test_smallest_fitting_profile():
    assert smallest_fitting("a100-40gb", 4 * 10**9).name == "1g.5gb"
    assert smallest_fitting("a100-40gb", 6 * 10**9).name == "1g.10gb"  # fewer SMs than 2g.10gb
    assert smallest_fitting("a100-40gb", 21 * 10**9).name == "7g.40gb"
    assert smallest_fitting("a100-40gb", 41 * 10**9) is None
    assert smallest_fitting("h200", 30 * 10**9).name == "1g.35gb"

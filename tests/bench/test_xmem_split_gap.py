"""benchmarks/xmem_split_gap.py: where a measurement falls in the replay's reserved - allocated gap."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from xmem_split_gap import gap_fraction  # noqa: E402

MiB = 2**20


@pytest.mark.parametrize(
    ("measured", "expected"),
    [(5000, 0.0), (6000, 1.0), (5500, 0.5), (4800, -0.2), (6200, 1.2)],
)
def test_gap_fraction_places_the_measurement_between_allocated_and_reserved(measured, expected):
    assert gap_fraction(measured * MiB, 5000 * MiB, 6000 * MiB) == pytest.approx(expected)


def test_gap_fraction_is_undefined_without_a_gap():
    assert gap_fraction(5000 * MiB, 5000 * MiB, 5000 * MiB) is None

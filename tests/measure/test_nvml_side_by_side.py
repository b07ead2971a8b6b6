"""benchmarks/nvml_side_by_side.py's verdict, without a GPU: what two side-by-side `peakmem
measure` results must look like when the NVML probe reads each process alone."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import nvml_side_by_side as sbs  # noqa: E402

GiB = 2**30
MiB = 2**20


def result(peak, source="nvml-process", status="ok"):
    return {"status": status, "peak_bytes": peak, "peak_source": source}


def test_each_process_alone_passes():
    context = 530 * MiB
    assert sbs.check_pair([result(1 * GiB + context), result(8 * GiB + context + 2 * MiB)],
                          [1 * GiB, 8 * GiB]) == []  # fmt: skip


def test_a_peak_that_counts_the_neighbour_fails():
    context = 530 * MiB
    # process 0 read the device-wide delta: its own 1 GiB plus the neighbour's 8 GiB
    failures = sbs.check_pair([result(9 * GiB + context, "nvml-device-delta"),
                               result(8 * GiB + context)], [1 * GiB, 8 * GiB])  # fmt: skip
    assert len(failures) == 2
    assert "peak_source 'nvml-device-delta'" in failures[0] and "outside [1, 4]" in failures[1]


def test_unknown_source_and_mismatched_peaks_fail():
    assert "peak_source 'unknown'" in sbs.check_pair(
        [result(0, "unknown"), result(8 * GiB)], [1 * GiB, 8 * GiB])[0]
    # both plausible alone, but the second carries 1 GiB more than its buffer explains
    (failure,) = sbs.check_pair([result(1 * GiB + 500 * MiB), result(8 * GiB + 1524 * MiB)],
                                [1 * GiB, 8 * GiB])  # fmt: skip
    assert "+1024 MiB" in failure

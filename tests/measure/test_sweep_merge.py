"""Merging sweeps that ran side by side: rows a neighbour could have changed are dropped."""

from __future__ import annotations

import gzip
from pathlib import Path

from peakmem.measure.sweep_merge import merge_parallel_rows, read_device_memory

TOTAL = 143771


def row(args: str, at: str, seconds: float = 3.0, status: str = "ok",
        source: str = "nvml-process") -> dict[str, str]:  # fmt: skip
    return {
        "job": "benchmarks/zoo/mlp.py", "args": args, "alloc_conf": "", "steps": "3",
        "status": status, "peak_source": source, "measured_at": at, "seconds": str(seconds),
    }  # fmt: skip


def device_log(tmp_path: Path, lines: list[tuple[str, int]]) -> Path:
    path = tmp_path / "device_memory.csv.gz"
    text = "".join(f"{ts}, {used}, {TOTAL}\n" for ts, used in lines) + "garbage line\n"
    path.write_bytes(gzip.compress(text.encode()))
    return path


def test_rows_in_a_nearly_full_window_or_read_device_wide_are_dropped(tmp_path):
    samples = read_device_memory(device_log(tmp_path, [
        ("2026/11/27 21:39:20.000", 50_000),
        ("2026/11/27 21:39:26.500", TOTAL - 600),  # nearly full for one sample
        ("2026/11/27 21:39:40.000", 60_000),
    ]))  # fmt: skip
    assert len(samples) == 3
    committed = [row("--batch-size 1", "2026-11-27T15:00:00Z")]
    parallel = [
        [
            row("--batch-size 1", "2026-11-27T21:39:27Z"),  # already committed: skipped silently
            row("--batch-size 2", "2026-11-27T21:39:30Z", seconds=5),  # window 21:39:10-31: full
            row("--batch-size 3", "2026-11-27T21:39:55Z", seconds=5),  # window 21:39:35-56: fine
            row("--batch-size 4", "2026-11-27T21:39:55Z", source="nvml-device-delta"),
            row("--batch-size 5", "2026-11-27T21:39:27Z", status="oom"),  # OOM beside a full device
            row("--batch-size 6", "2026-11-27T22:00:00Z", status="oom"),  # OOM on a free device
        ],
        [row("--batch-size 2", "2026-11-27T21:39:30Z", seconds=5),  # same row, other CSV
         row("--batch-size 3", "2026-11-27T21:50:00Z")],  # a second measurement of a kept key
    ]  # fmt: skip
    kept, dropped = merge_parallel_rows(committed, parallel, samples, headroom_mib=4096)
    assert [r["args"] for r in kept] == ["--batch-size 1", "--batch-size 3", "--batch-size 6"]
    assert kept[1]["measured_at"] == "2026-11-27T21:39:55Z"  # the first row of a key wins
    reasons = {d.row["args"]: d.reason for d in dropped}
    assert set(reasons) == {"--batch-size 2", "--batch-size 4", "--batch-size 5"}
    assert "nearly full" in reasons["--batch-size 2"]
    assert "nvml-device-delta" in reasons["--batch-size 4"]
    assert "nearly full" in reasons["--batch-size 5"]


def test_headroom_decides_what_counts_as_full(tmp_path):
    samples = read_device_memory(device_log(tmp_path, [("2026/11/27 21:39:26.500", TOTAL - 3000)]))
    parallel = [[row("--batch-size 2", "2026-11-27T21:39:30Z")]]
    assert len(merge_parallel_rows([], parallel, samples, headroom_mib=4096)[0]) == 0
    assert len(merge_parallel_rows([], parallel, samples, headroom_mib=2048)[0]) == 1


def test_a_row_whose_peak_was_unknown_is_dropped_whatever_its_status(tmp_path):
    samples = read_device_memory(device_log(tmp_path, [("2026/11/27 21:39:20.000", 50_000)]))
    parallel = [[row("--batch-size 2", "2026-11-27T21:39:30Z", status="error", source="unknown"),
                 row("--batch-size 3", "2026-11-27T21:39:30Z", status="error", source="")]]  # fmt: skip
    kept, dropped = merge_parallel_rows([], parallel, samples)
    assert [r["args"] for r in kept] == ["--batch-size 3"]  # the job's own error is a result
    assert [d.row["args"] for d in dropped] == ["--batch-size 2"]
    assert "measure it again" in dropped[0].reason

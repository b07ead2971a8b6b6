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
        ("2026/11/27 22:00:30.000", 60_000),  # the log covers every run
    ]))  # fmt: skip
    assert len(samples) == 4
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
    samples = read_device_memory(device_log(tmp_path, [("2026/11/27 21:39:20.000", 50_000),
                                                       ("2026/11/27 21:39:26.500", TOTAL - 3000),
                                                       ("2026/11/27 21:39:40.000", 50_000)]))
    parallel = [[row("--batch-size 2", "2026-11-27T21:39:30Z")]]
    assert len(merge_parallel_rows([], parallel, samples, headroom_mib=4096)[0]) == 0
    assert len(merge_parallel_rows([], parallel, samples, headroom_mib=2048)[0]) == 1


def test_a_row_whose_peak_was_unknown_is_dropped_whatever_its_status(tmp_path):
    samples = read_device_memory(device_log(tmp_path, [("2026/11/27 21:39:20.000", 50_000),
                                                       ("2026/11/27 21:39:40.000", 50_000)]))
    parallel = [[row("--batch-size 2", "2026-11-27T21:39:30Z", status="error", source="unknown"),
                 row("--batch-size 3", "2026-11-27T21:39:30Z", status="error", source="")]]  # fmt: skip
    kept, dropped = merge_parallel_rows([], parallel, samples)
    assert [r["args"] for r in kept] == ["--batch-size 3"]  # the job's own error is a result
    assert [d.row["args"] for d in dropped] == ["--batch-size 2"]
    assert "measure it again" in dropped[0].reason


def test_a_row_the_device_log_does_not_cover_is_dropped_not_kept_unchecked(tmp_path):
    """A log from another lease, or with timestamps in the future, has no sample while the run
    ran: nothing says the device had room, yet the row was kept (as if checked)."""
    samples = read_device_memory(device_log(tmp_path, [("2036/11/27 21:39:20.000", 50_000),
                                                       ("2036/11/27 21:49:20.000", 50_000)]))
    parallel = [[row("--batch-size 2", "2026-11-27T21:39:30Z")]]
    kept, dropped = merge_parallel_rows([], parallel, samples)
    assert kept == [] and len(dropped) == 1
    assert "does not cover the run" in dropped[0].reason
    assert "2036-11-27 21:39:20 to 21:49:20 UTC" in dropped[0].reason


def test_a_device_log_that_inflates_past_the_cap_is_refused_in_one_line(tmp_path, monkeypatch):
    """gzip.decompress inflated the whole log in memory: a gzip bomb (a few KiB inflating to
    gigabytes) filled the merge's memory. The log is inflated up to the cap."""
    import peakmem.measure.sweep_merge as merge

    monkeypatch.setattr(merge, "MAX_DEVICE_LOG_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.csv.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (4 << 20)))
    import pytest

    with pytest.raises(ValueError, match="more than 1048576 bytes") as caught:
        read_device_memory(bomb)
    assert "bomb.csv.gz" in str(caught.value) and "\n" not in str(caught.value)
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(gzip.compress(b"2026/11/27 21:39:20.000, 1, 2\n" * 100)[:40])
    with pytest.raises(ValueError, match="not a readable gzip"):
        read_device_memory(broken)


def _merge_script(tmp_path: Path, committed: bytes, new: bytes, log: bytes):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "c.csv").write_bytes(committed)
    (tmp_path / "n.csv").write_bytes(new)
    (tmp_path / "log").write_bytes(log)
    return subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "merge_parallel_sweep.py"), "--committed",
         "c.csv", "--device-log", "log", "--out", "o.csv", "n.csv"], cwd=tmp_path,
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(repo / "src")})


def test_the_merge_script_refuses_files_it_cannot_read_in_one_line(tmp_path):
    """A CSV that is not a ground-truth CSV, an empty or binary one, a broken gzip log ended the
    merge in a traceback (ValueError, UnicodeDecodeError, EOFError); a log whose timestamps are
    all in the future kept every new row unchecked."""
    from peakmem.measure.groundtruth import ALL_COLUMNS

    header = (",".join(ALL_COLUMNS) + "\n").encode()
    fields = {c: "" for c in ALL_COLUMNS} | {
        "job": "benchmarks/zoo/mlp.py", "args": "--batch-size 2", "status": "ok",
        "peak_source": "nvml-process", "measured_at": "2026-11-27T21:39:30Z", "seconds": "3"}
    new = header + (",".join(fields[c] for c in ALL_COLUMNS) + "\n").encode()
    log = b"2026/11/27 21:39:00.000, 50000, 143771\n2026/11/27 21:40:00.000, 50000, 143771\n"
    done = _merge_script(tmp_path, header, new, log)
    assert done.returncode == 0 and "0 committed + 1 new rows (0 dropped)" in done.stdout, done
    for committed, new_csv, device_log, words in [
        (b"a,b\n1,2\n", new, log, "c.csv: not a ground-truth CSV"),
        (b"", new, log, "c.csv: not a ground-truth CSV"),
        (header, bytes(range(128, 256)), log, "n.csv: 'utf-8' codec can't decode"),
        (header, new, gzip.compress(log)[:30], "log: not a readable gzip"),
        (header, new, log.replace(b"2026/", b"2036/"),
         "the device logs cover none of the 1 new rows' runs: the device log (2036-11-27"),
    ]:
        done = _merge_script(tmp_path, committed, new_csv, device_log)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert lines[0].startswith("Error: ") and words in lines[0], lines

"""The ground-truth dataset format: `benchmarks/groundtruth/<gpu>.csv`, one row per measured run.

The first twelve columns are the public contract; the rest add what makes a row reproducible
(measured steps, allocator config, the configuration id) and how it was measured."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from peakmem.measure.peak_source import UNKNOWN

COLUMNS = (
    "job",  # repo-relative script path
    "args",  # the script's arguments, shell-quoted
    "gpu",  # profile name, e.g. h200
    "torch",
    "cuda",
    "driver",
    "measured_peak_bytes",  # NVML device-level peak of the process
    "max_reserved_bytes",
    "max_allocated_bytes",
    "context_bytes",
    "status",  # ok | oom | error | timeout
    "seconds",
)
EXTRA_COLUMNS = (
    "steps",  # optimizer steps measured (`peakmem measure --steps`)
    "alloc_conf",  # PYTORCH_CUDA_ALLOC_CONF of the run
    "config",  # configuration id: job + args without the sweep's scale axis
    "sweep",  # the sweep definition that produced the row
    "gpu_name",
    "total_bytes",
    "peak_source",
    "sample_hz",
    "error",
    "measured_at",
    "snapshot",  # allocator snapshot file, when the sweep recorded one
)
ALL_COLUMNS = COLUMNS + EXTRA_COLUMNS
FINAL_STATUSES = frozenset({"ok", "oom", "timeout"})


def profile_name(gpu_name: str) -> str:
    """`NVIDIA H200` -> `h200`; `NVIDIA A100-SXM4-40GB` -> `a100-sxm4-40gb`."""
    name = gpu_name.lower().replace("nvidia", "").replace("geforce", "")
    name = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
    if not name:
        raise ValueError(f"cannot make a profile name from GPU name {gpu_name!r}")
    return name


@dataclass(frozen=True)
class RunKey:
    """What identifies a run for resuming: same job, args, allocator config and step count."""

    job: str
    args: str
    alloc_conf: str
    steps: int


def key_of_row(row: dict[str, str]) -> RunKey:
    return RunKey(row["job"], row["args"], row.get("alloc_conf", ""), int(row.get("steps") or 0))


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a ground-truth CSV (missing columns {missing})")
        return list(reader)


def done_keys(rows: Iterable[dict[str, str]], retry_errors: bool = False) -> set[RunKey]:
    """Keys of runs that need no new measurement. A run whose peak could not be read (an error
    row with peak_source `unknown`: the probe's failure, not the job's) is always measured
    again."""
    return {
        key_of_row(row)
        for row in rows
        if row["status"] in FINAL_STATUSES
        or (row["status"] == "error" and not retry_errors and not peak_was_unknown(row))
    }


def peak_was_unknown(row: dict[str, str]) -> bool:
    return row.get("peak_source") == UNKNOWN


def row_from_result(
    result: dict[str, Any], *, job: str, args: str, gpu: str, config: str, sweep: str
) -> dict[str, Any]:
    """A CSV row from a `peakmem measure --json` object. A run that finished but whose peak
    could not be read (peak_source `unknown`) becomes an `error` row with the reason."""
    status = result.get("status", "error")
    unknown = result.get("peak_source") == UNKNOWN
    error = result.get("error") or ""
    if unknown and status == "ok":
        status = "error"
        error = f"peak unknown: {result.get('peak_unknown') or 'no per-process reading'}"
    return {
        "job": job,
        "args": args,
        "gpu": gpu,
        "torch": result.get("torch", ""),
        "cuda": result.get("cuda", ""),
        "driver": result.get("driver", ""),
        "measured_peak_bytes": "" if unknown else result.get("peak_bytes", ""),
        "max_reserved_bytes": result.get("peak_reserved_bytes", ""),
        "max_allocated_bytes": result.get("peak_allocated_bytes", ""),
        "context_bytes": "" if unknown else result.get("context_bytes", ""),
        "status": status,
        "seconds": result.get("seconds", ""),
        "steps": result.get("steps_requested") or result.get("steps", ""),
        "alloc_conf": result.get("alloc_conf", ""),
        "config": config,
        "sweep": sweep,
        "gpu_name": result.get("gpu", ""),
        "total_bytes": result.get("total_bytes", ""),
        "peak_source": result.get("peak_source", ""),
        "sample_hz": result.get("sample_hz", ""),
        "error": error[:300],
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


class RowWriter:
    """Appends rows to the CSV, writing the header first when the file is new; flushes each row
    so that a killed sweep keeps everything it measured."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        existing = read_rows(path)  # validates the header of an existing file
        fieldnames: list[str] = list(ALL_COLUMNS)
        if existing:
            with path.open(newline="") as handle:
                fieldnames = next(csv.reader(handle))
        self._handle = path.open("a", newline="")
        self._writer = csv.DictWriter(self._handle, fieldnames=fieldnames, extrasaction="ignore")
        if not existing and path.stat().st_size == 0:
            self._writer.writeheader()
            self._handle.flush()

    def write(self, row: dict[str, Any]) -> None:
        self._writer.writerow(row)
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

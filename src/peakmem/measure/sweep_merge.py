"""Merge the CSVs of sweeps that ran side by side on one GPU into one ground-truth CSV.

Several sweep processes on one large GPU multiply the rows a lease yields. Each process's own
readings (NVML's per-process used memory, torch's max reserved / allocated) do not see a
neighbour, with two exceptions, and a row hit by either is dropped:

- the peak was not read from NVML's entry for the process (``peak_source`` other than
  ``nvml-process``): a device-wide delta counts the neighbours' memory, and ``unknown`` (the
  probe could not read the process: an error row, measured again) has no peak;
- the device was nearly full while the run ran (a device-wide memory log, nvidia-smi's
  ``timestamp,memory.used,memory.total`` in MiB): an allocation may have failed, the caching
  allocator then frees its cached blocks and retries (a lower reserved peak than alone) or the
  run ends in OOM where alone it would fit.

Rows are deduplicated on the sweep's run key (job, args, allocator config, steps); the first
row of a key wins (the committed CSV first). The device log's timestamps are taken as UTC (the
rows' ``measured_at`` is UTC); the run's window is ``measured_at - seconds - slack`` to
``measured_at``.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from peakmem.measure.groundtruth import key_of_row
from peakmem.measure.peak_source import PROCESS, UNKNOWN

DEFAULT_HEADROOM_MIB = 4096
DEFAULT_SLACK_S = 15.0
NOT_COVERED = "does not cover the run"
"""In the reason of a row measured outside the device logs' time span."""


@dataclass(frozen=True)
class DeviceSample:
    at: datetime
    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class Dropped:
    row: dict[str, str]
    reason: str


MAX_DEVICE_LOG_BYTES = 64 * 2**20
"""A device log is nvidia-smi's ~50 bytes per sample: 64 MiB is 37 hours of 10 Hz samples. A
larger file, or a gzip that inflates past it (a gzip bomb), is refused before it fills memory."""


def read_device_memory(path: Path) -> list[DeviceSample]:
    """nvidia-smi's ``--query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,
    nounits`` log (gzipped or plain); unreadable lines are skipped. ValueError (one line, naming
    the file) for a log past MAX_DEVICE_LOG_BYTES, plain or inflated, or a broken gzip."""
    with path.open("rb") as handle:
        raw = handle.read(MAX_DEVICE_LOG_BYTES + 1)
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as inflated:
                raw = inflated.read(MAX_DEVICE_LOG_BYTES + 1)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise ValueError(f"{path}: not a readable gzip ({exc})") from None
    if len(raw) > MAX_DEVICE_LOG_BYTES:
        raise ValueError(f"{path}: more than {MAX_DEVICE_LOG_BYTES} bytes (inflated): not an "
                         "nvidia-smi memory log")
    samples = []
    for line in raw.decode("utf-8", "replace").splitlines():  # nvidia-smi quotes nothing
        fields = line.split(",")
        if len(fields) != 3:
            continue
        try:
            at = datetime.strptime(fields[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC)
            samples.append(DeviceSample(at, int(fields[1]), int(fields[2])))
        except ValueError:
            continue
    return samples


def near_full_times(samples: Iterable[DeviceSample], headroom_mib: int) -> list[datetime]:
    return sorted(s.at for s in samples if s.total_mib - s.used_mib < headroom_mib)


def run_window(row: dict[str, str], slack_s: float) -> tuple[datetime, datetime] | None:
    try:
        end = datetime.strptime(row["measured_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        seconds = float(row.get("seconds") or 0.0)
    except (KeyError, ValueError):
        return None
    return end - timedelta(seconds=seconds + slack_s), end + timedelta(seconds=1)


def drop_reason(
    row: dict[str, str], full_times: Sequence[datetime], slack_s: float,
    span: tuple[datetime, datetime] | None = None,
) -> str | None:
    """Why a row measured beside other runs cannot be kept, or None."""
    if row.get("peak_source") == UNKNOWN:
        return "peak unknown (no per-process reading beside other processes): measure it again"
    if row.get("status") == "ok" and row.get("peak_source") != PROCESS:
        return f"peak read from {row.get('peak_source') or 'no source'} (counts the neighbours)"
    window = run_window(row, slack_s)
    if window is None:
        return "no measured_at / seconds to place the run in the device log"
    start, end = window
    if span is not None and not span[0] <= start + timedelta(seconds=slack_s) <= end <= \
            span[1] + timedelta(seconds=1):
        return (f"the device log ({span[0]:%Y-%m-%d %H:%M:%S} to {span[1]:%H:%M:%S} UTC) "
                f"{NOT_COVERED}: nothing says the device had room")
    if any(start <= at <= end for at in full_times):
        return "the device was nearly full during the run"
    return None


def merge_parallel_rows(
    committed: list[dict[str, str]],
    parallel: Iterable[list[dict[str, str]]],
    device_samples: Iterable[DeviceSample],
    *,
    headroom_mib: int = DEFAULT_HEADROOM_MIB,
    slack_s: float = DEFAULT_SLACK_S,
) -> tuple[list[dict[str, str]], list[Dropped]]:
    """The committed rows, then each new row of the parallel sweeps that passes `drop_reason`,
    first row per run key; and the dropped rows with their reasons."""
    device_samples = list(device_samples)
    full_times = near_full_times(device_samples, headroom_mib)
    times = [sample.at for sample in device_samples]
    span = (min(times), max(times)) if times else None
    kept = list(committed)
    seen = {key_of_row(row) for row in committed}
    dropped: list[Dropped] = []
    dropped_keys = set()
    for rows in parallel:
        for row in rows:
            key = key_of_row(row)
            if key in seen:
                continue
            reason = drop_reason(row, full_times, slack_s, span)
            if reason is not None:
                if key not in dropped_keys:  # the same row in two CSVs reported once
                    dropped_keys.add(key)
                    dropped.append(Dropped(row, reason))
                continue
            seen.add(key)
            kept.append(row)
    return kept, dropped

"""Capture the steady-state step of bench rows (their per-op costs), in parallel, cached.

The model's free parameters change far more often than the captures do: the capture of each row
(its `utilization` trace record) is kept in a JSON-lines cache keyed by the row and a digest of
the code that writes the record, so refitting and rescoring rerun no job.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import redirect_stderr, redirect_stdout
from functools import cache
from pathlib import Path
from typing import Any

from peakmem.datasets.rows import BenchRow
from peakmem.inputs import capped_lines, open_regular_file

DEFAULT_CACHE = Path.home() / ".cache" / "peakmem" / "utilization-steps.jsonl"
LINE_CAP = 64 << 20


@cache
def record_version() -> str:
    """A digest of what a step record depends on: the observer, the op cost registry and the
    GPUMemNet job scripts."""
    here = Path(__file__).resolve().parent
    package = here.parent
    repo = package.parents[1]
    files = [here / "observer.py", here / "op_costs.py", package / "capture" / "recorder.py",
             repo / "benchmarks" / "zoo" / "gpumemnet.py", package / "bench" / "gpumemnet_models.py"]
    digest = hashlib.sha1()
    for path in files:
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def cache_key(row: BenchRow) -> str:
    return f"{record_version()}|{row.dataset}|{row.id}"


class StepCache:
    """row key -> the row's step record (a dict) or an error string."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, Any] = {}
        if path is None or not path.exists():
            return
        with open_regular_file(path, cap=1 << 32) as handle:
            for _, line in capped_lines(handle, str(path), LINE_CAP, LINE_CAP):
                try:
                    entry = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                    value = entry.get("record", entry.get("error"))
                    if isinstance(value, (dict, str)):
                        self.entries[entry["key"]] = value

    def put(self, key: str, value: dict[str, Any] | str) -> None:
        self.entries[key] = value
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        field = "record" if isinstance(value, dict) else "error"
        with self.path.open("a") as fh:
            fh.write(json.dumps({"key": key, field: value}) + "\n")


CAPTURE_STEPS = 5
"""Steps captured per row: a loader's shortened epoch yields 3 full batches and its last one,
so step 5 (the next epoch's first batch) is a full steady step for any epoch length."""


def capture_step(row: BenchRow) -> dict[str, Any] | str:
    """The row's steady-state step record, or a one-line reason it has none."""
    from peakmem.baselines.base import CannotEstimate
    from peakmem.baselines.peakmem_estimator import job_command, row_environment
    from peakmem.capture.environment import environment_set
    from peakmem.estimate import EstimateError, estimate_command
    from peakmem.utilization.kernel_families import META_KEY

    sink = io.StringIO()
    try:
        argv = job_command(row)
        with redirect_stdout(sink), redirect_stderr(sink), environment_set(row_environment(row)):
            estimate = estimate_command(argv, gpu=row.gpu, torch_version=row.torch_version,
                                        steps=CAPTURE_STEPS, isolate=False)
        capture = estimate.capture
    except EstimateError as exc:
        capture = exc.capture  # a job that trained, then raised: its steps were recorded
        if capture is None or not capture.trained:
            return f"cannot estimate: {str(exc).strip().splitlines()[-1][:120]}"
    except CannotEstimate as exc:
        return f"cannot estimate: {exc}"
    except Exception as exc:  # noqa: BLE001 - one bad row must not end a long run
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    record = capture.trace.meta.get(META_KEY) if capture is not None else None
    return record if isinstance(record, dict) else "no steady-state step recorded"


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _work(key: str, row: BenchRow) -> tuple[str, dict[str, Any] | str]:
    return key, capture_step(row)


def collect(
    rows: list[BenchRow],
    cache: StepCache,
    *,
    jobs: int = 1,
    on_total: Callable[[int], None] | None = None,
    on_result: Callable[[], None] | None = None,
) -> dict[str, dict[str, Any] | str]:
    """row id -> step record (or error) for every row, capturing the rows not cached."""
    keys = {row.id: cache_key(row) for row in rows}
    todo = [row for row in rows if keys[row.id] not in cache.entries]
    if on_total:
        on_total(len(todo))
    if jobs <= 1 or len(todo) <= 1:
        for row in todo:
            cache.put(keys[row.id], capture_step(row))
            if on_result:
                on_result()
    else:
        with ProcessPoolExecutor(
            max_workers=min(jobs, os.cpu_count() or 1), initializer=_init_worker
        ) as pool:
            futures = [pool.submit(_work, keys[row.id], row) for row in todo]
            for future in as_completed(futures):
                key, value = future.result()
                cache.put(key, value)
                if on_result:
                    on_result()
    return {row.id: cache.entries[keys[row.id]] for row in rows}

"""Run estimators over bench rows: in parallel across CPU cores, resumable through a cache file.

The cache is a JSON-lines file, one line per (dataset, estimator, row id) result, appended as
results arrive: an interrupted run picks up where it stopped. Results of estimators that fit on
the data (GPUMemNet's cross-validation) depend on the whole dataset, not only the row; their key
includes the dataset's row count.

In parallel (a process pool forked from this process, the "fork" start method), this process
runs the first row itself and the workers are forked after it (`warm_parent`): they start with
torch, peakmem and the job's modules imported and the process-wide caches filled, instead of
each paying that itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from peakmem.baselines.base import CannotEstimate, Estimator, MissingPackage
from peakmem.bench.metrics import RowResult
from peakmem.datasets.rows import BenchRow
from peakmem.inputs import capped_lines, open_regular_file

CACHE_VERSION = 1
DEFAULT_CACHE = Path.home() / ".cache" / "peakmem" / "bench-cache.jsonl"


UNAVAILABLE_HERE = "unavailable here: "
"""Prefix of a result that depends on this machine (a missing optional package): not cached."""


def cache_key(dataset: str, estimator: str, row_id: str) -> str:
    return f"v{CACHE_VERSION}|{dataset}|{estimator}|{row_id}"


def estimator_tag(name: str, estimator: Estimator, dataset_size: int) -> str:
    """The estimator part of a cache key: its name, the dataset size (estimators that fit on the
    whole set change with it) and its version where it has one (peakmem: a source digest)."""
    version = getattr(estimator, "version", "")
    return f"{name}@{dataset_size}" + (f"#{version}" if version else "")


def cacheable(result: RowResult) -> bool:
    return not (result.error or "").startswith(UNAVAILABLE_HERE)


CACHE_LINE_CAP = 1 << 20
_RESULT_FIELDS = {
    "row_id": (str,),
    "family": (str,),
    "status": (str,),
    "measured_bytes": (int,),
    "gpu_total_bytes": (int,),
    "estimate_bytes": (int, type(None)),
    "seconds": (float, int, type(None)),
    "error": (str, type(None)),
    "stated_margin": (float, int, type(None)),
}


def _cache_entry(line: str) -> tuple[str, RowResult] | None:
    """(key, result) of one cache line; None for anything but a well-formed result."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        return None
    data = entry.get("result")
    if not isinstance(data, dict) or set(data) - set(_RESULT_FIELDS):
        return None
    for name, types in _RESULT_FIELDS.items():
        value = data.get(name)
        if name not in data and type(None) in types:
            continue
        if not isinstance(value, types) or isinstance(value, bool):
            return None
        if isinstance(value, (int, float)) and not 0 <= value < 2**63:
            return None  # negative, NaN, infinite or huge numbers are not results
    if data["status"] not in ("ok", "oom"):
        return None
    return entry["key"], RowResult.from_json(data)


def _check_cache_start(path: Path, number: int, line: str) -> None:
    """InputError unless the first line of an existing cache opens a JSON object (a whole one,
    or one torn by an interrupted first write): results are appended to the file, and
    `--cache` naming a dataset CSV (or any other file) added JSON lines to it (the dataset then
    failed to load)."""
    from peakmem.inputs import InputError

    if not line.lstrip().startswith("{"):
        raise InputError(f"{path}:{number}: not a peakmem bench cache (a JSON-lines file of "
                         "results); results are appended to it: name another file")


class ResultCache:
    """Append-only JSON-lines store of RowResults keyed by dataset + estimator + row id."""

    def __init__(self, path: Path | None) -> None:
        """Read the cache at `path` (None: keep results in memory only). A line that is not a
        well-formed result (a torn last line from an interrupted run, an edited or foreign
        line) is skipped, so that row is computed again. A path that exists but is not a
        regular file (a directory, FIFO, device) or is over the input-file cap raises
        InputError."""
        self.path = path
        self._entries: dict[str, RowResult] = {}
        if path is None or not path.exists():
            return
        with open_regular_file(path) as handle:
            first = True
            for number, line in capped_lines(handle, str(path), CACHE_LINE_CAP, CACHE_LINE_CAP):
                if first and line.strip():
                    first = False
                    _check_cache_start(path, number, line)
                entry = _cache_entry(line)
                if entry is not None:
                    self._entries[entry[0]] = entry[1]

    def get(self, key: str) -> RowResult | None:
        return self._entries.get(key)

    def put(self, key: str, result: RowResult) -> None:
        self._entries[key] = result
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(json.dumps({"key": key, "result": result.to_json()}) + "\n")


def estimate_row(estimator: Estimator, row: BenchRow) -> RowResult:
    """One estimate as a RowResult; failures become an `error` string, never an exception."""
    base = dict(
        row_id=row.id,
        family=row.family,
        status=row.status,
        measured_bytes=row.measured_peak_bytes,
        gpu_total_bytes=row.gpu_total_bytes,
    )
    try:
        estimate = estimator.estimate(row)
    except MissingPackage as exc:
        return RowResult(**base, estimate_bytes=None, seconds=None,
                         error=f"{UNAVAILABLE_HERE}{exc}")
    except CannotEstimate as exc:
        return RowResult(**base, estimate_bytes=None, seconds=None, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - one bad row must not end a long bench run
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        return RowResult(**base, estimate_bytes=None, seconds=None, error=message)
    return RowResult(**base, estimate_bytes=estimate.peak_bytes, seconds=estimate.seconds,
                     stated_margin=estimate.stated_margin)


_WORKER_ESTIMATORS: dict[str, Estimator] = {}


def _init_worker(estimators: dict[str, Estimator]) -> None:
    import torch

    torch.set_num_threads(1)
    _WORKER_ESTIMATORS.update(estimators)
    freeze_start_up_objects()


def freeze_start_up_objects() -> int:
    """Move the objects of the worker's start-up (torch, peakmem's capture and estimate
    modules: ~300 000 objects that live as long as the worker) out of the garbage collector's
    reach (`gc.freeze`), after one collection so that no garbage is frozen. The oldest
    generation's collections then scan only what the rows made: they cost ~150 ms each with
    the start-up objects in (2 every 15 GPUMemNet CNN rows, ~8% of their CPU), ~15 ms without.
    Returns the number of objects frozen. The estimates do not depend on when cycles are
    collected (tests/bench/test_worker_gc.py compares whole estimates with and without)."""
    import gc

    import peakmem.capture.runner  # noqa: F401  (what every estimate imports)
    import peakmem.estimate  # noqa: F401

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _work(name: str, row: BenchRow) -> tuple[str, RowResult]:
    result = estimate_row(_WORKER_ESTIMATORS[name], row)
    after_worker_row()
    return name, result


_WORKER_ROWS = [0]


def after_worker_row() -> bool:
    """Count a row done in this worker; after its 1st, 2nd, 4th, 8th, ... row, freeze again
    (`freeze_start_up_objects`) what is alive, and say whether it did. A worker's first rows
    import what the start-up did not (~130 000 objects for the first GPUMemNet CNN row: the
    job's libraries, torch's lazily loaded modules) and fill the process-wide caches; left in
    the oldest generation, every full collection walked them again (CNN rows: 3 in 15 rows,
    ~100 ms each, ~8.5% of the rows' CPU; with them frozen after the first row ~45 ms each).
    Only what is alive is frozen, after a collection; what dies later through a reference
    cycle stays uncollected, so the freezes thin out (powers of two: 11 in 1 634 rows)."""
    _WORKER_ROWS[0] += 1
    done = _WORKER_ROWS[0]
    if done & (done - 1):
        return False
    freeze_start_up_objects()
    return True


def _work_pair(item: tuple[str, BenchRow]) -> tuple[str, RowResult]:
    return _work(*item)


def forks_warm_workers() -> bool:
    """Whether the pool's workers are forked from this process (the "fork" start method,
    Linux's default before Python 3.14): they then start with what this process has imported
    and cached, so it warms itself first (`warm_parent`)."""
    import multiprocessing

    return multiprocessing.get_start_method() == "fork"


def warm_parent(estimators: dict[str, Estimator], name: str, row: BenchRow) -> RowResult:
    """Make this process what a worker is after its first row, by being one for `row`: the
    worker's set-up (`_init_worker`: torch imported with one intra-op thread, the start-up
    objects frozen), then the row itself (`_work`), whose result is returned. Workers forked
    afterwards start there: torch, peakmem and the job's modules imported, the process-wide
    caches (meta kernels, op costs, namespace index) filled, the first capture's one-off work
    done. Each worker paid that itself before (GPUMemNet CNN rows: ~1.7 CPU s of set-up and
    ~1.3 s more in its first row); now the parent pays it once. A row's estimate does not
    depend on the process that runs it (the serial path runs every row here)."""
    _init_worker(estimators)
    return _work(name, row)[1]


def run_estimators(
    estimators: dict[str, Estimator],
    rows: list[BenchRow],
    *,
    dataset: str,
    cache: ResultCache,
    jobs: int = 1,
    all_rows: list[BenchRow] | None = None,
    on_result: Callable[[], None] | None = None,
    on_total: Callable[[int], None] | None = None,
    use_ray: bool = False,
    ray_address: str | None = None,
) -> dict[str, list[RowResult]]:
    """Every estimator on every row; cached results are reused, new ones appended.

    Estimators with rows left to do are first `prepare`d on `all_rows` (the whole dataset, of
    which `rows` may be a subset), in this process.
    """
    all_rows = rows if all_rows is None else all_rows
    dataset_size = len(all_rows)
    results: dict[str, dict[str, RowResult]] = {name: {} for name in estimators}
    todo: list[tuple[str, BenchRow, str]] = []
    for name in estimators:
        tag = estimator_tag(name, estimators[name], dataset_size)
        for row in rows:
            key = cache_key(dataset, tag, row.id)
            hit = cache.get(key)
            if hit is not None:
                results[name][row.id] = hit
            else:
                todo.append((name, row, key))
    for name in sorted({name for name, _, _ in todo}):
        estimators[name].prepare(all_rows)
    if on_total:
        on_total(len(todo))
    if (jobs <= 1 or len(todo) <= 1) and not use_ray:
        for name, row, key in todo:
            result = estimate_row(estimators[name], row)
            if cacheable(result):
                cache.put(key, result)
            results[name][row.id] = result
            if on_result:
                on_result()
    elif use_ray:  # the same Ray path as `peakmem batch` (a local Ray, or ray_address)
        from peakmem.service.ray_pool import ray_imap_unordered

        keys = {(name, row.id): key for name, row, key in todo}
        for name, result in ray_imap_unordered(
            _work_pair, [(name, row) for name, row, _ in todo], workers=jobs,
            address=ray_address, initializer=_init_worker, initargs=(estimators,),
        ):
            if cacheable(result):
                cache.put(keys[(name, result.row_id)], result)
            results[name][result.row_id] = result
            if on_result:
                on_result()
    else:
        keys = {(name, row.id): key for name, row, key in todo}
        if forks_warm_workers():  # the first row here, then the workers forked warm
            name, row, key = todo[0]
            result = warm_parent(estimators, name, row)
            if cacheable(result):
                cache.put(key, result)
            results[name][row.id] = result
            if on_result:
                on_result()
            todo = todo[1:]
        with ProcessPoolExecutor(
            max_workers=min(jobs, os.cpu_count() or 1),
            initializer=_init_worker,
            initargs=(estimators,),
        ) as pool:
            futures = [pool.submit(_work, name, row) for name, row, _ in todo]
            for future in as_completed(futures):
                name, result = future.result()
                if cacheable(result):
                    cache.put(keys[(name, result.row_id)], result)
                results[name][result.row_id] = result
                if on_result:
                    on_result()
    return {name: [results[name][row.id] for row in rows] for name in estimators}

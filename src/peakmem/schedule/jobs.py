"""The jobs `pack` places: estimate JSON files (`peakmem estimate --json` output), or a jobs
file of commands that peakmem estimates itself.

A jobs file holds one JSON object per line (blank lines and lines starting with `#` skipped):

  {"id": "bert", "command": ["python", "train.py", "--bs", "32"], "gpu": "a100-40gb",
   "options": {"steps": 3, "mode": "auto", "timeout": 600, "torch": "2.4.1",
               "alloc_conf": "expandable_segments:True", "max_host_memory": "8GiB"}}

`id` (unique) and `command` are required; `gpu` defaults to the first GPU of the inventory.
Everything read here is untrusted: sizes and types are checked, nothing is evaluated.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from peakmem.inputs import InputError, one_line, open_regular_file, read_capped
from peakmem.schedule.pack import MARGIN_FAILURE_RATE, PackError, PackJob

MAX_FILE_BYTES = 64 * 2**20
MAX_JOBS = 100_000
JOB_OPTIONS = ("steps", "mode", "timeout", "torch", "alloc_conf", "max_host_memory")


def _read(path: str) -> str:
    """A regular file's text, at most MAX_FILE_BYTES (PackError otherwise). Opened without
    blocking (`open_regular_file`): a FIFO given as the file hung `pack` until a writer came."""
    try:
        with open_regular_file(path, cap=MAX_FILE_BYTES) as handle:
            data = read_capped(handle, MAX_FILE_BYTES, path)
    except InputError as exc:
        raise PackError(str(exc)) from None
    except OSError as exc:
        raise PackError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PackError(f"{path}: not UTF-8 text") from None


class _DuplicateKey(ValueError):
    """An object of the file names one key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; _DuplicateKey where a key comes twice (json keeps the
    last one silently, other readers the first: `{"peak_bytes": 9e9, ..., "peak_bytes": 1}`
    packed as a 1-byte job)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _DuplicateKey(key)
        found[key] = value
    return found


def _loads(text: str, where: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise PackError(f"{where}: the key {one_line(repr(exc.args[0]), 60)} appears twice in one object "
                        "(which one counts is ambiguous)") from None
    except json.JSONDecodeError as exc:
        raise PackError(f"{where}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:  # huge integers, absurd nesting
        raise PackError(f"{where}: not usable JSON ({type(exc).__name__})") from None


MAX_BYTES = 1 << 63
"""Byte counts at or past this (8 EiB, 1e308) are no GPU's peak: the file is not an estimate."""


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(math.ceil(value)) if 0 <= value < MAX_BYTES else None


def job_from_estimate(name: str, estimate: Any) -> PackJob:
    """A PackJob from one `peakmem estimate --json` object (PackError if it is not one)."""
    if not isinstance(estimate, dict):
        raise PackError(f"{name}: not an estimate object")
    if "error" in estimate and "peak_bytes" not in estimate:
        error = estimate.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        raise PackError(f"{name}: the estimate failed ({str(message or error)[:300]})")
    peak = _int(estimate.get("peak_bytes"))
    with_margin = _int(estimate.get("peak_bytes_with_margin", estimate.get("peak_bytes")))
    if with_margin is None or peak is None:
        raise PackError(
            f"{name}: no non-negative `peak_bytes` / `peak_bytes_with_margin` (is it the output of "
            "`peakmem estimate --json`?)"
        )
    if with_margin < peak:  # a margin subtracts nothing: placing by it would overcommit the GPU
        raise PackError(
            f"{name}: `peak_bytes_with_margin` ({with_margin}) is below `peak_bytes` ({peak}): "
            "not the output of `peakmem estimate --json`"
        )
    margin = estimate.get("safety_margin", 0.0)
    margin = float(margin) if isinstance(margin, (int, float)) and math.isfinite(margin) else 0.0
    rate = estimate.get("margin_failure_rate")
    if not (isinstance(rate, (int, float)) and 0 <= rate <= 1):
        rate = MARGIN_FAILURE_RATE if margin > 0 else None
    assumptions = estimate.get("assumptions")
    margin_assumed = isinstance(assumptions, list) and any(
        isinstance(a, str) and a.startswith("safety margin") for a in assumptions
    )
    return PackJob(
        name=name,
        margin_assumed=margin_assumed,
        bytes_with_margin=with_margin,
        peak_bytes=peak,
        safety_margin=margin,
        gpu=estimate.get("gpu") if isinstance(estimate.get("gpu"), str) else None,
        smact=smact_of(estimate, name),
        failure_rate=rate,
        estimate=estimate,
    )


def smact_of(estimate: dict[str, Any], name: str = "the estimate") -> float | None:
    """`utilization.smact` (0..1) of an estimate, None when absent; PackError when malformed."""
    utilization = estimate.get("utilization")
    if not isinstance(utilization, dict) or utilization.get("smact") is None:
        return None
    value = utilization["smact"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise PackError(f"{name}: utilization.smact must be a number from 0 to 1, got {value!r}")
    return float(value)


def load_estimate_files(paths: Sequence[str]) -> list[PackJob]:
    """One job per estimate JSON file, named by the file's name (its path where two share one)."""
    base = [os.path.basename(p) for p in paths]
    shared = Counter(base)  # base.count(name) per file was quadratic: 100k files, ~30 min
    jobs = []
    for path, name in zip(paths, base, strict=True):
        label = name if shared[name] == 1 else path
        data = _loads(_read(path), path)
        jobs.append(job_from_estimate(label, data))
    return jobs


def read_jobs_file(path: str) -> list[dict[str, Any]]:
    """The entries of a jobs file, checked (PackError naming the line)."""
    entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, line in enumerate(_read(path).split("\n"), 1):  # not splitlines: U+2028 may
        # sit inside a JSON string
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{path}:{number}"
        entry = _loads(text, where)
        if not isinstance(entry, dict):
            raise PackError(f"{where}: expected an object with `id` and `command`")
        unknown = set(entry) - {"id", "command", "gpu", "options"}
        if unknown:
            raise PackError(f"{where}: unknown keys {sorted(unknown)}")
        job_id, command = entry.get("id"), entry.get("command")
        if not isinstance(job_id, str) or not job_id.strip() or len(job_id) > 200:
            raise PackError(f"{where}: `id` must be a non-empty string (at most 200 characters)")
        if job_id in seen:
            raise PackError(f"{where}: `id` {job_id!r} appears twice")
        seen.add(job_id)
        if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)):
            raise PackError(f"{where}: `command` must be a non-empty list of strings")
        if "gpu" in entry and not isinstance(entry["gpu"], str):
            raise PackError(f"{where}: `gpu` must be a GPU profile name")
        options = entry.get("options", {})
        if not isinstance(options, dict) or set(options) - set(JOB_OPTIONS):
            raise PackError(f"{where}: `options` may hold only {', '.join(JOB_OPTIONS)}")
        entries.append(entry)
        if len(entries) > MAX_JOBS:
            raise PackError(f"{path}: more than {MAX_JOBS} jobs")
    if not entries:
        raise PackError(f"{path}: no jobs")
    return entries


Estimator = Callable[..., Any]


def estimate_jobs_file(
    path: str,
    default_gpu: str,
    *,
    timeout: float | None = None,
    sandbox: Any = None,
    estimator: Estimator | None = None,
    on_job: Callable[[str], None] | None = None,
) -> tuple[list[PackJob], list[tuple[PackJob, str]]]:
    """Estimate every job of a jobs file (in a supervised child each). Jobs whose estimate
    failed come back second, with the one-line reason. Every entry's GPU and host-memory cap
    are checked before the first estimate runs: a bad line 50 is not found after 49 estimates."""
    if estimator is None:
        from peakmem.estimate import estimate_command as estimator
    from peakmem.estimate import EstimateError
    from peakmem.profiles import ProfileError

    runs = [(entry, _estimate_kwargs(entry, path, default_gpu, timeout, sandbox))
            for entry in read_jobs_file(path)]
    jobs: list[PackJob] = []
    failed: list[tuple[PackJob, str]] = []
    for entry, kwargs in runs:
        if on_job is not None:
            on_job(entry["id"])
        try:
            result = estimator(list(entry["command"]), **kwargs)
        except EstimateError as exc:
            failed.append((PackJob(entry["id"], 0), f"the estimate failed ({exc.kind}): {exc.message}"))
            continue
        except (ProfileError, TypeError, ValueError) as exc:
            raise PackError(f"{path}: job {entry['id']!r}: {exc}") from None
        estimate = result.to_json() if hasattr(result, "to_json") else result
        jobs.append(job_from_estimate(entry["id"], estimate))
    return jobs, failed


def _estimate_kwargs(entry: dict[str, Any], path: str, default_gpu: str, timeout: float | None,
                     sandbox: Any) -> dict[str, Any]:
    """The estimator's keyword arguments for one jobs-file entry; PackError naming the job
    where its GPU is unknown or its max_host_memory is not a size."""
    from peakmem.cli.common import parse_bytes
    from peakmem.profiles import ProfileError, load_gpu

    options = dict(entry.get("options", {}))
    kwargs: dict[str, Any] = {"gpu": entry.get("gpu", default_gpu)}
    try:
        load_gpu(kwargs["gpu"])
    except ProfileError as exc:
        raise PackError(f"{path}: job {entry['id']!r}: {exc}") from None
    if "torch" in options:
        kwargs["torch_version"] = options.pop("torch")
    if "max_host_memory" in options:
        raw = options.pop("max_host_memory")
        try:
            kwargs["max_host_memory"] = raw if isinstance(raw, int) else parse_bytes(str(raw), "max_host_memory")
        except ValueError as exc:
            raise PackError(f"{path}: job {entry['id']!r}: {exc}") from None
    kwargs.update(options)
    kwargs.setdefault("timeout", timeout)
    if sandbox is not None:
        kwargs["sandbox"] = sandbox
    return kwargs

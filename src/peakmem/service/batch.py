"""`peakmem batch JOBS.jsonl`: many estimates at once on Ray (a local Ray by default, any cluster
with `ray_address`), results streamed to a JSON-lines file as they finish, resumable.

Each line of JOBS.jsonl is one job: `{"id": "...", "command": ["python", "train.py", ...],
"files": {"PATH": "TEXT"}, "gpu": "...", "options": {...}}`, or `"cwd": "DIR"` instead of
`files` for a job whose files are already on disk (relative to the JOBS file's directory; on a
multi-node cluster, a path every node has). Each result line: `{"id", "status": "done" |
"failed", "result", "error", "key", "attempts", "seconds", "retryable"}`. A rerun skips the ids
whose last line is final (done, or failed by the job itself); `retry_failed` reruns every failure.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from peakmem.service.jobs import (
    EstimateJob,
    JobFailed,
    WorkerLost,
    error_object,
    job_problem,
    load_estimator,
)
from peakmem.service.models import EstimateRequest


class BatchInputError(ValueError):
    """The jobs file cannot be used (unreadable, a line that is not a JSON object with an id,
    a duplicated id): the contract's bad_input."""


class BatchJob(EstimateRequest):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(..., min_length=1, max_length=256)
    cwd: str | None = Field(None, max_length=4096)

    @model_validator(mode="after")
    def _files_or_cwd(self) -> BatchJob:
        if self.cwd is not None and self.files:
            raise ValueError("give `files` or `cwd`, not both")
        if self.cwd is not None and ("\x00" in self.cwd or not self.cwd.strip()):
            # resolve() raised ValueError: the job failed as a retryable internal error
            raise ValueError("`cwd` must be a directory path (no NUL character, not blank)")
        return self


@dataclass(frozen=True)
class BatchSettings:
    estimator: str | None = None
    """`module:function` (default: `peakmem estimate --json` in a child process)."""
    sandbox: bool = False
    max_seconds: float | None = None
    max_host_memory: int | None = None
    max_attempts: int = 2
    job_nice: int = 10
    """Niceness added to each job's worker process (`peakmem batch --job-nice`, as `peakmem serve
    --job-nice`): the estimates yield the CPU to the batch driver, the Ray processes and whatever
    else the machine serves."""


@dataclass
class BatchSummary:
    total: int = 0
    skipped: int = 0
    done: int = 0
    failed: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


def read_jobs(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(id, raw job object) of every line; BatchInputError for a line without a usable id."""
    from peakmem.inputs import InputError, open_regular_file, read_capped

    try:
        with open_regular_file(path, cap=MAX_JOBS_FILE_BYTES) as handle:
            text = read_capped(handle, MAX_JOBS_FILE_BYTES, str(path)).decode("utf-8")
    except InputError as exc:
        raise BatchInputError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BatchInputError(f"cannot read {path}: {exc}") from None
    jobs: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    # JSON lines end at "\n" only: a JSON string may hold U+2028 or \x1c, which splitlines()
    # would take for line breaks
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise BatchInputError(f"{path} line {number}: not JSON ({exc})") from None
        except RecursionError:
            raise BatchInputError(f"{path} line {number}: not JSON (nested too deeply)") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
            raise BatchInputError(f"{path} line {number}: a job is a JSON object with an \"id\"")
        if raw["id"] in seen:
            raise BatchInputError(f"{path} line {number}: id {raw['id']!r} appears twice")
        seen.add(raw["id"])
        jobs.append((raw["id"], raw))
    return jobs


MAX_JOBS_FILE_BYTES = 1 << 30
"""The largest jobs file read (each job's files ride inline: 1 GiB is thousands of jobs)."""


def check_output(output: Path) -> None:
    """BatchInputError unless `output` is a regular file or not there yet: /dev/zero or
    /dev/full would be read for ever when looking for finished ids, a FIFO would block."""
    try:
        info = output.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BatchInputError(f"cannot use {output} as the results file: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise BatchInputError(f"the results file {output} is {kind}")


def check_not_the_jobs_file(output: Path, jobs_path: Path) -> None:
    """BatchInputError when `output` is the jobs file itself (by name, symlink or hard link):
    the results were appended to the jobs, and every later run refused the file (an id twice)."""
    try:
        same = output.exists() and os.path.samefile(output, jobs_path)
    except OSError:
        return  # check_output / read_jobs say what is wrong with either
    if same:
        raise BatchInputError(f"the results file {output} is the jobs file {jobs_path}: "
                              "results are appended to it; name another with -o")


def check_not_a_job_input(output: Path, jobs: list[tuple[str, dict[str, Any]]], base: str) -> None:
    """BatchInputError when `output` is a Python source file or a file a job's command names
    (relative to the job's cwd): `-o train.py` appended the results to the jobs' own script."""
    if not output.is_file():
        return
    if output.suffix.lower() == ".py":
        raise BatchInputError(f"the results file {output} is a Python source file: results are "
                              "appended to it; name another with -o")
    for job_id, raw in jobs:
        command, cwd = raw.get("command"), raw.get("cwd")
        if not isinstance(command, list):
            continue
        where = os.path.join(base, cwd) if isinstance(cwd, str) else base
        for word in command:
            if not isinstance(word, str) or not word or "\0" in word:
                continue
            try:
                same = os.path.samefile(os.path.join(where, word), output)
            except (OSError, ValueError):
                continue
            if same:
                raise BatchInputError(f"the results file {output} is {word!r}, a file the "
                                      f"command of job {job_id!r} names; name another with -o")


MAX_RESULT_LINE_BYTES = 64 << 20
"""The longest results line read back (a result is a few KiB); a longer one is not one of ours
and is passed over in chunks, never held whole (a crash's NUL-filled or sparse tail has none)."""


def _result_lines(handle) -> Iterator[bytes]:
    """The lines of a results file opened in binary, each at most MAX_RESULT_LINE_BYTES; a
    longer line is skipped without being held in memory. Read in 1 MiB blocks: readline() with
    a limit took 50 s over a 2 GB line."""
    pending = bytearray()
    skipping = False  # inside a line already too long
    while block := handle.read(1 << 20):
        start = 0
        while (end := block.find(b"\n", start)) != -1:
            if not skipping and len(pending) + end + 1 - start <= MAX_RESULT_LINE_BYTES:
                pending += block[start:end + 1]
                yield bytes(pending)
            pending.clear()
            skipping, start = False, end + 1
        if not skipping:
            pending += block[start:]
            if len(pending) > MAX_RESULT_LINE_BYTES:
                pending.clear()
                skipping = True
    if pending and not skipping:
        yield bytes(pending)


def _final(entry: dict[str, Any], retry_failed: bool) -> bool:
    """Whether a results line is a final one of ours: done with its result object, or failed
    (not retryable) with its error object. A line saying `done` with no result is not final:
    the job is run again rather than counted as estimated."""
    if entry.get("status") == "done":
        return isinstance(entry.get("result"), dict)
    return (entry.get("status") == "failed" and isinstance(entry.get("error"), dict)
            and not retry_failed and entry.get("retryable") is not True)


def finished_ids(output: Path, retry_failed: bool = False) -> set[str]:
    """Ids whose last line in `output` is final (a rerun skips them)."""
    last: dict[str, dict[str, Any]] = {}
    check_output(output)
    try:
        with output.open("rb") as fh:
            for number, raw in enumerate(_result_lines(fh)):
                text = raw.decode("utf-8", errors="replace")
                if number == 0:
                    text = text.removeprefix("\ufeff")  # saved by an editor with a BOM
                try:
                    entry = json.loads(text)
                except (ValueError, RecursionError):
                    continue  # a line cut short by a crash, or not one of ours
                if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                    last[entry["id"]] = entry
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise BatchInputError(f"cannot read the results file {output}: {exc.strerror}") from None
    return {job_id for job_id, entry in last.items() if _final(entry, retry_failed)}


def to_job(raw: dict[str, Any], base: Path) -> EstimateJob:
    """The EstimateJob of a raw line; JobFailed (bad_input) when it is not a valid job."""
    try:
        parsed = BatchJob.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise JobFailed(error_object("bad_input", f"bad job: {where}: {first.get('msg')}", 2,
                                     "bad_input")) from None
    from peakmem.service.files import FilesError, check_files

    try:
        files = check_files({k: v.encode("utf-8") for k, v in parsed.files.items()})
    except (FilesError, UnicodeEncodeError) as exc:
        raise JobFailed(error_object("bad_input", str(exc), 2, "bad_input")) from None
    cwd = str((base / parsed.cwd).resolve()) if parsed.cwd is not None else None
    job = EstimateJob(tuple(parsed.command), files, parsed.gpu, parsed.options.as_dict(), cwd)
    problem = job_problem(job)
    if problem is not None:
        raise JobFailed(error_object("bad_input", problem, 2, "bad_input"))
    return job


def run_one(job_id: str, raw: dict[str, Any], base: str, settings: BatchSettings) -> dict[str, Any]:
    """Estimate one job; always a result line, never an exception (a Ray task or in-process)."""
    from peakmem.service.attempt import run_attempt

    started = time.monotonic()
    line: dict[str, Any] = {"id": job_id, "status": "failed", "result": None, "error": None,
                            "key": None, "attempts": 0, "seconds": 0.0, "retryable": False}
    try:
        job = to_job(raw, Path(base))
        line["key"] = job.key()
        if settings.estimator:
            estimator = load_estimator(settings.estimator)
        else:
            from peakmem.service.estimators import cli_estimator as estimator
        while True:
            line["attempts"] += 1
            try:
                line["result"] = run_attempt(
                    job, estimator, sandbox=settings.sandbox, max_seconds=settings.max_seconds,
                    max_host_memory=settings.max_host_memory, nice=settings.job_nice)
                line["status"] = "done"
                break
            except WorkerLost as exc:
                if line["attempts"] >= settings.max_attempts:
                    line["error"] = {**exc.error, "message": f"{exc.error['message']} (tried "
                                     f"{line['attempts']} times)"}
                    line["retryable"] = True
                    break
    except JobFailed as exc:
        line["error"] = exc.error
    except Exception as exc:  # noqa: BLE001 - one bad job must not end the batch
        line["error"] = error_object("internal", f"peakmem internal error: {type(exc).__name__}: "
                                     f"{exc}", 70, "internal")
        line["retryable"] = True
    line["seconds"] = round(time.monotonic() - started, 3)
    return line


def run_one_on_ray(job_id: str, raw: dict[str, Any], base: str,
                   settings: BatchSettings) -> dict[str, Any]:
    """`run_one` as a Ray task: its result line also names the Ray node that ran it
    (`ray_node`, Ray's node id), so a multi-node run shows where each job went."""
    import ray

    line = run_one(job_id, raw, base, settings)
    line["ray_node"] = ray.get_runtime_context().get_node_id()
    return line


class ResultWriter:
    """Appends result lines, flushed one by one (a crash loses at most the line being written)."""

    def __init__(self, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fh = path.open("a+b")
            # a torn last line (a crash mid-write) must not glue to the first new one; only
            # the last byte is read (the file may be huge)
            size = self.fh.seek(0, os.SEEK_END)
            if size:
                self.fh.seek(size - 1)
                if self.fh.read(1) != b"\n":
                    self.fh.write(b"\n")
        except OSError as exc:
            where = f" (a symlink to {os.readlink(path)!r})" if path.is_symlink() else ""
            raise BatchInputError(f"cannot write the results file {path}{where}: "
                                  f"{exc.strerror or exc}") from None

    def write(self, line: dict[str, Any]) -> None:
        self.fh.write((json.dumps(line, sort_keys=True) + "\n").encode("utf-8"))
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


def run_batch(
    jobs_path: Path,
    output: Path,
    settings: BatchSettings,
    *,
    ray_address: str | None = None,
    workers: int | None = None,
    in_process: bool = False,
    retry_failed: bool = False,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> BatchSummary:
    """Run every job of `jobs_path` not already final in `output`, appending to `output`."""
    jobs = read_jobs(jobs_path)
    check_not_the_jobs_file(output, jobs_path)
    check_not_a_job_input(output, jobs, str(jobs_path.resolve().parent))
    finished = finished_ids(output, retry_failed)
    todo = [(job_id, raw) for job_id, raw in jobs if job_id not in finished]
    summary = BatchSummary(total=len(jobs), skipped=len(jobs) - len(todo))
    writer = ResultWriter(output)  # a results file that cannot be written: before the bar
    if on_start:
        on_start(len(todo))
    base = str(jobs_path.resolve().parent)
    started = time.monotonic()
    try:
        runner = _in_process if in_process else _on_ray(ray_address, workers)
        for line in runner(todo, base, settings):
            writer.write(line)
            if line["status"] == "done":
                summary.done += 1
            else:
                summary.failed += 1
                summary.failures.append(f"{line['id']}: {(line['error'] or {}).get('message')}")
            if on_result:
                on_result(line)
    finally:
        writer.close()
    summary.seconds = time.monotonic() - started
    return summary


def _in_process(todo, base, settings) -> Iterator[dict[str, Any]]:
    for job_id, raw in todo:
        yield run_one(job_id, raw, base, settings)


def _on_ray(address: str | None, workers: int | None):
    def run(todo, base, settings) -> Iterator[dict[str, Any]]:
        from peakmem.service.ray_pool import ray_connect

        ray = ray_connect(address, workers)
        remote = ray.remote(num_cpus=1, max_retries=2, retry_exceptions=False)(run_one_on_ray)
        pending = {remote.remote(job_id, raw, base, settings): job_id for job_id, raw in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=None)
            for ref in ready:
                job_id = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the task's worker died every retry
                    yield {"id": job_id, "status": "failed", "result": None, "key": None,
                           "attempts": 3, "seconds": 0.0, "retryable": True,
                           "error": error_object("job_failed", f"the Ray task failed: "
                                                 f"{type(exc).__name__}: {str(exc)[:300]}", 1,
                                                 "signal")}
    return run

"""Capture an unmodified script in a child process supervised by peakmem (the parent side).

:func:`capture_in_child` writes a request, starts :mod:`peakmem.capture.child` under
:func:`peakmem.jobs.supervisor.run_child` (own process group, wall-clock timeout, host memory
cap, output away from peakmem's stdout), then reads the child's result file back without
executing anything. Every way the child can end becomes a CaptureResult: the child's own report
when it delivered one, else a failure whose ``reason`` says how it ended ("timeout",
"host_memory", "signal", "no_result", "bad_result").
"""

from __future__ import annotations

import json
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path

from peakmem.capture.child import child_command
from peakmem.capture.result import CaptureResult
from peakmem.capture.result_io import JobError, ResultFormatError, capture_result, decode
from peakmem.jobs.file_rollback import keep_job_files, roll_back
from peakmem.jobs.supervisor import (
    ChildOutcome,
    ChildSpec,
    Limits,
    OutcomeStatus,
    ResultFileError,
    Sandboxing,
    read_result_file,
    run_child,
)
from peakmem.jobs.zygote_client import warm_starter
from peakmem.profiles import GpuProfile
from peakmem.trace.events import Trace


def capture_in_child(
    argv: Sequence[str],
    *,
    gpu: GpuProfile,
    torch_version: str,
    alloc_conf: str | None = None,
    steps: int | str | None = None,
    mode: str = "fake",
    timeout: float | None = None,
    max_host_memory: int | None = None,
    output_fd: int | None = None,
    sandbox: Sandboxing = None,
    env: dict[str, str] | None = None,
) -> CaptureResult:
    """Run `python script.py args` / `python -m module args` in a fresh child and capture it.

    `output_fd`: where the job's stdout and stderr go (None: this process's stderr). `sandbox`:
    a command prefix for the child, or a ``peakmem.jobs.sandbox.Sandbox`` (its scratch
    directory is the child's private directory, which holds the request and the result). `env`:
    the child's whole environment (None: this process's; a distributed rank's: jobs.launchers).

    When a warm job process (`peakmem warm`, jobs.zygote) runs for this python and peakmem, the
    child is forked from it (torch and the preloaded modules already imported) and otherwise
    runs as a cold one; the notes say so, and say why when it had to start cold instead. A
    sandboxed child always starts cold."""
    with tempfile.TemporaryDirectory(prefix="peakmem-job-", ignore_cleanup_errors=True) as tmp:
        request_path, result_path = Path(tmp) / "request.json", Path(tmp) / "result.jsonl"
        request = {
            "argv": list(argv),
            "gpu": gpu.name,
            "torch_version": torch_version,
            "alloc_conf": alloc_conf,
            "steps": steps,
            "mode": mode,
            "result": str(result_path),
        }
        job_files = journal_directory(Path(tmp), sandbox)
        if job_files is not None:
            request["job_files"] = str(job_files)
        request_path.write_text(json.dumps(request), encoding="utf-8")
        spec = ChildSpec(
            argv=child_command(request_path), result_path=result_path, output_fd=output_fd,
            env=env,
        )
        starter = None if sandbox else warm_starter(argv)
        try:
            outcome = run_child(spec, Limits(timeout, max_host_memory), sandbox=sandbox,
                                starter=starter)
        finally:  # the job's process has ended (or peakmem is stopping): its files go back
            files = None if job_files is None else roll_back(job_files)
        result = outcome_capture(outcome, mode, timeout, max_host_memory, sandboxed=bool(sandbox))
        if files is not None:
            result.notes.extend(files.notes())
        if starter is not None and starter.note:
            result.notes.append(starter.note)
        return result


def journal_directory(tmp: Path, sandbox: Sandboxing) -> Path | None:
    """Where the job's process journals the files it changes; None where nothing is journaled:
    with --keep-job-files (the job's files stay as it leaves them), and in a sandbox (there the
    job can write nothing outside its scratch directory, and its journal is not to be trusted)."""
    if sandbox or keep_job_files():
        return None
    directory = tmp / "job-files"
    directory.mkdir()
    return directory


def _failure(mode: str, reason: str, text: str, exit_code: int = 1, **fields: object) -> CaptureResult:
    result = CaptureResult(
        trace=Trace(), steps=0, stopped=False, forward_calls=0, seconds=0, mode=mode,
        error=JobError(reason, text), error_text=text, exit_code=exit_code, reason=reason,
    )
    for name, value in fields.items():
        setattr(result, name, value)
    return result


def timed_out(mode: str, timeout: float | None) -> CaptureResult:
    """The failure of a pass that had no time left to start."""
    return _failure(mode, "timeout", f"the job ran past the time limit of {timeout or 0:g} s",
                    exit_code=124)


def outcome_capture(
    outcome: ChildOutcome,
    mode: str,
    timeout: float | None,
    max_host_memory: int | None,
    sandboxed: bool = False,
) -> CaptureResult:
    """The CaptureResult for how the child ended (and what it reported)."""
    if outcome.status == OutcomeStatus.TIMEOUT:
        return _failure(mode, "timeout", f"the job ran past the time limit of {timeout:g} s",
                        exit_code=124, seconds=outcome.seconds)
    if outcome.status == OutcomeStatus.HOST_MEMORY:
        return _failure(
            mode, "host_memory",
            f"the job went over the host-memory cap of {_size(max_host_memory or 0)} "
            f"(--max-host-memory; by default a share of the machine's memory, "
            f"PEAKMEM_MAX_HOST_MEMORY): its processes held {_size(outcome.peak_rss_bytes)} "
            f"resident; it was stopped",
            seconds=outcome.seconds,
        )
    try:
        data = read_result_file(outcome.result_path) if outcome.result_path else None
        decoded = decode(data) if data is not None else None
    except (ResultFileError, ResultFormatError) as exc:
        return _failure(mode, "bad_result", f"peakmem could not read the job's result: {exc}")
    if decoded is not None:
        fields, trace, pid = decoded
        if not sandboxed and pid != outcome.pid:
            return _failure(mode, "bad_result",
                            "the job's result did not come from the job's own process")
        if trace is None:
            return _failure(mode, "internal",
                            f"peakmem internal error in the job's process:\n{fields['internal']}",
                            exit_code=70)
        result = capture_result(fields, trace)
        result.seconds = max(result.seconds, 0.0)
        return result
    if sandboxed and outcome.returncode is not None and outcome.returncode > 128:
        try:  # a sandbox wrapper reports a job killed by signal N as status 128 + N
            outcome.signal = signal.Signals(outcome.returncode - 128).name
            outcome.status, outcome.returncode = OutcomeStatus.SIGNALED, None
        except ValueError:
            pass
    if outcome.status == OutcomeStatus.SIGNALED:
        how = ("stopped itself (SIGSTOP or another stop signal) and was left stopped: peakmem "
               "ended it" if outcome.signal == "SIGSTOP" else f"was killed by {outcome.signal}")
        return _failure(
            mode, "signal",
            f"the job's process {how} before the estimate",
            signal=outcome.signal, seconds=outcome.seconds,
        )
    code = outcome.returncode
    return _failure(
        mode, "no_result",
        f"the job's process ended (status {code}) before it reported a result; see the job's "
        "output",
        job_exit_code=code, seconds=outcome.seconds,
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit} ({n} B)"
    return f"{n} B"

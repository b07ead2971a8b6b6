"""Estimate a multi-process (distributed) launch, rank by rank.

Each traced rank runs in a child of its own with the environment its launcher would give it
(:mod:`peakmem.jobs.launchers`); inside, its process groups are fake groups of the full world size
(:mod:`peakmem.capture.fake_distributed`). One representative rank (0) is traced by default;
``ranks`` names others, or "all". Each rank's trace is simulated on its own; the estimate is the
largest rank's (its peak is the headline, `fits` is its), and ``ranks`` lists every traced rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from peakmem.capture.environment import environment_set
from peakmem.capture.result import CaptureResult
from peakmem.estimate.api import (
    Estimate,
    EstimateError,
    _capture_supervised,
    _capture_with_mode,
    _check_command,
    _finish,
)
from peakmem.jobs.launchers import (
    MAX_WORLD_SIZE,
    Launch,
    LaunchError,
    parse_launch,
    parse_ranks,
)
from peakmem.profiles import GpuProfile, StackProfile


def launch_for(argv: Sequence[str], nproc_per_node: int | None = None,
               nnodes: int | None = None, ranks: str | None = None) -> Launch | None:
    """The distributed launch `argv` (and peakmem's own options) describe, or None for a
    single process; EstimateError (bad_input / unsupported) for a launch that cannot run."""
    try:
        launch = parse_launch(argv, nproc_per_node, nnodes)
    except LaunchError as exc:
        raise EstimateError(str(exc), exit_code=3 if exc.unsupported else 2,
                            reason="unsupported" if exc.unsupported else "bad_input") from None
    if (launch is None or not launch.distributed) and ranks is not None:
        raise EstimateError("--ranks needs a distributed launch (--nproc-per-node N, or a "
                            "launcher such as torchrun)", exit_code=2, reason="bad_input")
    return launch


def traced_ranks(launch: Launch, ranks: str | None) -> list[int]:
    try:
        return parse_ranks(ranks, launch.world_size)
    except LaunchError as exc:
        raise EstimateError(str(exc), exit_code=2, reason="bad_input") from None


@contextlib.contextmanager
def rank_environment(env: dict[str, str]) -> Iterator[None]:
    """`os.environ` updated with a rank's variables for the duration (in-process captures)."""
    with environment_set(env):
        yield


def rank_row(rank: int, estimate: Estimate) -> dict[str, Any]:
    """One rank's line of `--json`'s `ranks`."""
    return {
        "rank": rank,
        "peak_bytes": estimate.peak_bytes,
        "peak_reserved_bytes": estimate.peak_reserved_bytes,
        "peak_allocated_bytes": estimate.peak_allocated_bytes,
        "library_bytes": estimate.library_bytes,
        "libraries": dict(sorted(estimate.libraries.items())),
        "fits": estimate.fits,
        "headroom_bytes": estimate.headroom_bytes,
        "peak_bytes_with_margin": estimate.peak_bytes_with_margin,
        "steps": estimate.steps,
        "mode": estimate.mode,
        "seconds": round(estimate.seconds, 3),
    }


def estimate_launch(
    launch: Launch,
    ranks: str | None,
    *,
    gpu: GpuProfile,
    stack: StackProfile,
    torch_version: str,
    alloc_conf: str,
    steps: Any,
    mode: str,
    timeout: float | None,
    timeline: bool,
    max_host_memory: int | None,
    job_log: str | os.PathLike[str] | None,
    sandbox: Any,
    isolate: bool,
) -> Estimate:
    """Trace the chosen ranks of `launch` and estimate each; the largest rank's Estimate, with
    every traced rank in its `distributed["ranks"]`."""
    chosen = traced_ranks(launch, ranks)
    for rank in chosen[:1]:
        _check_command(launch.rank_command(rank))
    started = time.monotonic()
    if not isolate:
        captures = {rank: _capture_in_process(launch, rank, gpu, stack, torch_version, alloc_conf,
                                              steps, mode, timeout) for rank in chosen}
    elif len(chosen) == 1:
        rank = chosen[0]
        captures = {rank: _capture_supervised(
            launch.rank_command(rank), gpu, torch_version, alloc_conf, steps, mode, timeout,
            max_host_memory, job_log, sandbox, env={**os.environ, **launch.rank_env(rank)},
        )}
    else:
        captures = _capture_ranks(launch, chosen, gpu, torch_version, alloc_conf, steps, mode,
                                  timeout, max_host_memory, job_log, sandbox)
    estimates: dict[int, Estimate] = {}
    for rank in chosen:
        try:
            estimates[rank] = _finish(captures[rank], gpu=gpu, stack=stack,
                                      torch_version=torch_version, alloc_conf=alloc_conf,
                                      mode=mode, timeline=timeline)
        except EstimateError as exc:
            if launch.world_size > 1:
                failed = getattr(captures[rank], "peakmem_rank", rank)
                exc.message = f"rank {failed}: {exc.message}"
            raise
    largest = max(chosen, key=lambda rank: (estimates[rank].peak_bytes, -rank))
    result = estimates[largest]
    result.seconds = time.monotonic() - started if len(chosen) > 1 else result.seconds
    result.notes = _notes(launch, chosen, largest) + list(result.notes)
    result.distributed = {
        **launch.describe(),
        "traced_ranks": chosen,
        "largest_rank": largest,
        "ranks": [rank_row(rank, estimates[rank]) for rank in chosen],
    }
    return result


def _notes(launch: Launch, chosen: list[int], largest: int) -> list[str]:
    notes = [f"distributed: {launch.launcher}, world size {launch.world_size} "
             f"({launch.nnodes} node(s) x {launch.nproc_per_node} process(es)); process groups "
             "were fake (collectives send nothing)"]
    if len(chosen) == 1:
        notes.append(f"one representative rank ({chosen[0]}) was traced; where ranks do "
                     "different work (pipeline stages, rank-0 extras) trace them with --ranks all")
    else:
        notes.append(f"{len(chosen)} ranks traced; the largest is rank {largest} (its peak is "
                     "the estimate's)")
    notes.extend(launch.notes)
    return notes


def _capture_in_process(launch: Launch, rank: int, gpu: GpuProfile, stack: StackProfile,
                        version: str, conf: str, steps: Any, mode: str,
                        timeout: float | None) -> CaptureResult:
    from peakmem.capture import capture_command
    from peakmem.capture.fake_memory import allocator_target
    from peakmem.capture.job_alloc_conf import job_environment

    with rank_environment(launch.rank_env(rank)), job_environment(conf, version), \
            allocator_target(conf, version):
        def run(run_mode: str, run_steps: Any = steps) -> CaptureResult:
            return capture_command(launch.rank_command(rank), gpu=gpu, stack=stack,
                                   steps=run_steps, timeout=timeout, mode=run_mode)

        return _capture_with_mode(run, mode, run if steps is None else None)


def _capture_ranks(launch: Launch, chosen: list[int], gpu: GpuProfile, version: str, conf: str,
                   steps: Any, mode: str, timeout: float | None, max_host_memory: int | None,
                   job_log: str | os.PathLike[str] | None, sandbox: Any,
                   ) -> dict[int, CaptureResult]:
    """Every chosen rank in a child of its own, all at once (jobs.supervisor.run_children); in
    auto mode a rank that fake mode cannot run is rerun eagerly on its own."""
    deadline = None if timeout is None else time.monotonic() + timeout
    log_fd = None
    if job_log is not None:
        try:
            from peakmem.jobs.job_log import open_job_log

            log_fd = open_job_log(job_log)
        except OSError as exc:
            raise EstimateError(str(exc), exit_code=2, reason="bad_input") from None
    try:
        first_mode = "eager" if mode == "eager" else "fake"
        first = _run_ranks(launch, chosen, first_mode, gpu, version, conf, steps, timeout,
                           max_host_memory, log_fd, sandbox)
        captures = {}
        for rank in chosen:
            def run(run_mode: str, rank: int = rank) -> CaptureResult:
                if run_mode == first_mode:
                    return first[rank]
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    from peakmem.capture.supervised import timed_out

                    return timed_out(run_mode, timeout)
                return _run_ranks(launch, [rank], run_mode, gpu, version, conf, steps,
                                  remaining, max_host_memory, log_fd, sandbox)[rank]

            def unshortened(run_mode: str, limit: int, rank: int = rank) -> CaptureResult:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    from peakmem.capture.supervised import timed_out

                    return timed_out(run_mode, timeout)
                return _run_ranks(launch, [rank], run_mode, gpu, version, conf, limit,
                                  remaining, max_host_memory, log_fd, sandbox)[rank]

            captures[rank] = _capture_with_mode(run, mode,
                                                unshortened if steps is None else None)
    finally:
        if log_fd is not None:
            os.close(log_fd)
    return captures


def _run_ranks(launch: Launch, chosen: list[int], mode: str, gpu: GpuProfile, version: str,
               conf: str, steps: Any, timeout: float | None, max_host_memory: int | None,
               log_fd: int | None, sandbox: Any) -> dict[int, CaptureResult]:
    from peakmem.capture.child import child_command
    from peakmem.capture.supervised import journal_directory, outcome_capture
    from peakmem.jobs.file_rollback import roll_back
    from peakmem.jobs.supervisor import ChildSpec, Limits, OutcomeStatus, run_children

    with tempfile.TemporaryDirectory(prefix="peakmem-ranks-", ignore_cleanup_errors=True) as tmp:
        specs = []
        job_files = journal_directory(Path(tmp), sandbox)
        for rank in chosen:
            directory = Path(tmp) / f"rank{rank}"
            directory.mkdir()
            request_path, result_path = directory / "request.json", directory / "result.jsonl"
            request_path.write_text(json.dumps({
                "argv": launch.rank_command(rank), "gpu": gpu.name, "torch_version": version,
                "alloc_conf": conf, "steps": steps, "mode": mode, "result": str(result_path),
                **({"job_files": str(job_files)} if job_files is not None else {}),
            }), encoding="utf-8")
            specs.append(ChildSpec(argv=child_command(request_path), result_path=result_path,
                                   output_fd=log_fd, env={**os.environ, **launch.rank_env(rank)}))
        try:
            outcomes = run_children(specs, Limits(timeout, max_host_memory), sandbox=sandbox)
        finally:  # every rank has ended (or peakmem is stopping): their files go back
            files_notes = [] if job_files is None else roll_back(job_files).notes()
        captures = {}
        for rank, outcome in zip(chosen, outcomes, strict=True):
            capture = outcome_capture(outcome, mode, timeout, max_host_memory,
                                      sandboxed=bool(sandbox))
            if outcome.status == OutcomeStatus.CANCELLED:
                capture.error_text = ("stopped because another rank failed first")
            capture.peakmem_rank = rank  # type: ignore[attr-defined]
            capture.notes.extend(files_notes)
            captures[rank] = capture
        # the rank that failed first is the one to report
        failed = [rank for rank, o in zip(chosen, outcomes, strict=True)
                  if not o.ok and o.status != OutcomeStatus.CANCELLED]
        cancelled = [rank for rank, o in zip(chosen, outcomes, strict=True)
                     if o.status == OutcomeStatus.CANCELLED]
        if failed and cancelled:
            for rank in cancelled:
                captures[rank] = captures[failed[0]]
        return captures


SELF_LAUNCHERS = frozenset({"lightning"})
"""Libraries that start their ranks themselves from a plain `python train.py`; the capture traces
rank 0 and says so in its trace meta (capture.lightning_launch)."""


def self_launch(capture: CaptureResult, argv: Sequence[str]) -> Launch | None:
    """The launch a plain command made by itself (Lightning's `devices=N`), from its capture's
    trace meta; None when it made none (or the meta is malformed)."""
    info = capture.trace.meta.get("launch") if isinstance(capture.trace.meta, dict) else None
    if not isinstance(info, dict) or info.get("launcher") not in SELF_LAUNCHERS:
        return None
    shape = [info.get(name) for name in ("nproc_per_node", "nnodes", "world_size")]
    if not all(type(value) is int and 1 <= value <= MAX_WORLD_SIZE for value in shape):
        return None
    nproc, nnodes, world = shape
    if nproc * nnodes != world:
        return None
    return Launch(command=tuple(argv), nproc_per_node=nproc, nnodes=nnodes,
                  launcher=str(info["launcher"]))


def adopt_self_launch(result: Estimate, capture: CaptureResult, argv: Sequence[str]) -> Estimate:
    """A plain command that launched its own ranks: `world_size` and `ranks` as for torchrun
    (rank 0 traced)."""
    launch = self_launch(capture, argv)
    if launch is None or result.distributed:
        return result
    result.notes = [
        _notes(launch, [0], 0)[0],
        f"rank 0 of {launch.world_size} was traced; to trace others run the script with "
        f"--nproc-per-node {launch.nproc_per_node} --ranks all (with a launch from outside, "
        "Lightning's ddp and fsdp strategies start no process themselves)",
        *result.notes,
    ]
    result.distributed = {
        **launch.describe(),
        "traced_ranks": [0],
        "largest_rank": 0,
        "ranks": [rank_row(0, result)],
    }
    return result

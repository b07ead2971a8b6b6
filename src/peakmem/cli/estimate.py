"""`peakmem estimate [options] -- python train.py [args]`.

The job runs in a child process supervised by peakmem (``peakmem.jobs.supervisor``); its output
goes to stderr (or ``--job-log``), never to stdout. Every failure is one line on stderr (the job's
trimmed traceback before it where the job raised), or with ``--json`` ONE ``{"error": {...}}``
object on stdout; the exit code follows the contract (README, "Exit codes").
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import traceback
from typing import Any, NoReturn

import click

from peakmem.cli.emit_options import emit_options
from peakmem.cli.model_options import MODEL_OPTION_NAMES, model_command, model_options
from peakmem.cli.steps_option import STEPS


class _Seconds(click.ParamType):
    """A finite positive number of seconds (`nan`, `inf`, 0 and negatives are refused)."""

    name = "seconds"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not (math.isfinite(seconds) and seconds > 0):
            self.fail(f"{value!r} is not a finite positive number of seconds", param, ctx)
        return seconds


class _Bytes(click.ParamType):
    """A positive size: 8GiB, 500MB, or a number of bytes."""

    name = "bytes"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        from peakmem.cli.common import parse_bytes

        if isinstance(value, int):
            size = value
        else:
            try:
                flag = param.opts[0] if param is not None and param.opts else "the size"
                size = parse_bytes(str(value), flag)  # not "--capacity": this flag's own name
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if size <= 0:
            self.fail(f"{value!r} is not a positive size", param, ctx)
        return size


class _EstimateCommand(click.Command):
    """Bad flags are one line on stderr, or the `--json` error object on stdout (exit 2)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
        try:
            ours = args[: args.index("--")] if "--" in args else list(args)
            rest = super().parse_args(ctx, args)
            _refuse_unknown_option(self, ctx, ours)
            return rest
        except click.UsageError as exc:
            from peakmem.estimate.api import EstimateError

            report(EstimateError(exc.format_message(), exit_code=2, reason="bad_input"),
                   wants_json)


def _refuse_unknown_option(command: click.Command, ctx: click.Context,
                           ours: list[str]) -> None:
    """An unknown option before the job's command (`--gpus a100 -- python ...`) would be taken
    for the command itself: refuse it by name, with the nearest option, as click does. (`ours`:
    the arguments before `--`, the only place peakmem's options are.)"""
    job = ctx.params.get("command") or ()
    if not job or not str(job[0]).startswith("-") or job[0] not in ours:
        return
    import difflib

    option = str(job[0]).split("=", 1)[0]
    known = [name for param in command.params for name in getattr(param, "opts", [])
             if name.startswith("--")]
    near = difflib.get_close_matches(option, known, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise click.UsageError(f"no such option: {option}{hint}", ctx)


def _job_command(command: tuple[str, ...], model: dict[str, Any], as_json: bool) -> tuple[str, ...]:
    """The command to estimate (a generated script with --model); bad input reported. An
    environment prefix (`env NAME=VALUE python ...`) stays on the command: the launch parsing
    under estimate_command takes it off (jobs.launchers.parse_launch)."""
    try:
        return model_command(command, model)
    except ValueError as exc:
        from peakmem.estimate.api import EstimateError

        report(EstimateError(str(exc), exit_code=2, reason="bad_input"), as_json)


def report(error: Any, as_json: bool) -> NoReturn:
    """Print an EstimateError as the contract says and exit with its code."""
    if as_json:
        click.echo(json.dumps(error.to_json()))
    else:
        if error.traceback:
            click.echo(error.traceback.rstrip(), err=True)
        prefix = "" if error.message.startswith("peakmem") else "peakmem: error: "
        click.echo(f"{prefix}{error.message}", err=True)
    sys.exit(error.exit_code)


def internal_error(exc: BaseException) -> Any:
    """peakmem's own bug, with peakmem's frames (never shown as the job's traceback)."""
    from peakmem.estimate.api import EstimateError

    try:
        detail = f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001
        detail = type(exc).__name__
    text = "".join(traceback.format_exception(exc))
    return EstimateError(f"peakmem internal error: {detail}", exit_code=70, reason="internal",
                         traceback=text)


@click.command(
    "estimate",
    cls=_EstimateCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--gpu", default="h100-80gb", show_default=True, help="Target GPU profile name.")
@click.option(
    "--torch", "torch_version", default=None, help="Target PyTorch version [default: installed]."
)
@click.option("--alloc-conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF of the target run.")
@click.option(
    "--steps",
    default=None,
    type=STEPS,
    help="Optimizer steps to run, or 'all' to run the job to its end [default: 3, or a DataLoader epoch + 2, then the training loop is ended so evaluation after it still runs].",
)
@click.option(
    "--mode",
    type=click.Choice(["fake", "eager", "auto"]),
    default="auto",
    show_default=True,
    help="fake: meta device tensors, no compute; eager: also their real values on the CPU (for "
    "ops fake tensors cannot run, exact data-dependent sizes); auto: fake, eager if fake cannot "
    "run the job.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (also on failure).")
@click.option("--verbose", "-v", is_flag=True,
              help="List every assumption (default: one line naming them; --json has them all).")
@click.option(
    "--timeline",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a memory timeline (.html or .png).",
)
@click.option(
    "--snapshot",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the simulated run as a torch.cuda.memory._snapshot() pickle (open it at "
    "https://pytorch.org/memory_viz).",
)
@click.option(
    "--timeout",
    type=_Seconds(),
    default=None,
    help="Wall-clock seconds before the job (all its processes) is stopped; exit 124.",
)
@click.option(
    "--max-host-memory",
    type=_Bytes(),
    default=None,
    metavar="BYTES",
    help="Stop the job when its processes hold more host RAM than this (e.g. 8GiB, 500MB) "
    "[default: 75% of the machine's memory; PEAKMEM_MAX_HOST_MEMORY=SIZE or off].",
)
@click.option(
    "--job-log",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the job's stdout and stderr to this file [default: peakmem's stderr].",
)
@click.option(
    "--sandbox",
    is_flag=True,
    help="Run the job without network, with the filesystem read-only except a scratch "
    "directory, under CPU/file/process limits (Linux: bubblewrap or unshare; exit 3 where "
    "neither works). See SECURITY.md.",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(1, 1 << 16),
    default=None,
    help="Processes (GPUs) per node of a distributed launch: the job runs as torchrun would "
    "start it, with a fake process group of the full world size.",
)
@click.option("--nnodes", type=click.IntRange(1, 1 << 16), default=None,
              help="Nodes of a distributed launch [default: 1, or the launcher's].")
@click.option(
    "--ranks",
    default=None,
    metavar="RANKS",
    help="Ranks of a distributed launch to trace, each in its own process: all, or a list "
    "(0,3,4-7) [default: 0]; the estimate is the largest rank's.",
)
@click.option(
    "--repeat-steady",
    is_flag=True,
    help="With --steps N: once 3 steps in a row left the same events, write the rest up to N "
    "by repeating the last instead of running them (the same estimate, faster; not where a "
    "DataLoader's short last batch is ahead; you vouch that the job runs at least N steps "
    "and no step-count-dependent code). Also PEAKMEM_REPEAT_STEADY=1.",
)
@click.option(
    "--keep-job-files",
    is_flag=True,
    help="Keep the files the job wrote, changed or removed as it left them (logs, checkpoints "
    "of fake weights). By default peakmem puts every path outside temp and cache directories "
    "back as it was before the estimate. Also PEAKMEM_KEEP_JOB_FILES=1.",
)
@emit_options
@model_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=False)
def estimate_cmd(**params: Any) -> None:
    """Estimate the peak GPU memory of a training script, on this machine, without a GPU
    (or, with --model CONFIG, of a standard training script for a transformers config)."""
    as_json = params["as_json"]
    if params.pop("repeat_steady"):
        from peakmem.capture.step_repeat import ENV_FLAG

        os.environ[ENV_FLAG] = "1"  # the job's process (child, warm process) reads it
    if params.pop("keep_job_files"):
        from peakmem.jobs.file_rollback import KEEP_ENV

        os.environ[KEEP_ENV] = "1"  # read where the job's process ended (capture.supervised)
    try:
        model = {name: params.pop(name) for name in MODEL_OPTION_NAMES}
        command = _job_command(params.pop("command"), model, as_json)
        emit_request = _emit_request(params.pop("emit"), params.pop("emit_option"),
                                     params.pop("mib_per_shard"), command, as_json)
        distributed = {name: params.pop(name) for name in ("nproc_per_node", "nnodes", "ranks")}
        _estimate(command=command, emit_request=emit_request, distributed=distributed, **params)
    except (SystemExit, KeyboardInterrupt, click.exceptions.Exit, click.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - a bug in peakmem: exit 70 with its frames
        report(internal_error(exc), as_json)


def _estimate(
    gpu: str,
    torch_version: str | None,
    alloc_conf: str | None,
    steps: int | None,
    mode: str,
    as_json: bool,
    timeline: str | None,
    timeout: float | None,
    max_host_memory: int | None,
    job_log: str | None,
    sandbox: bool,
    command: tuple[str, ...],
    emit_request: tuple[str, dict[str, Any]] | None = None,
    snapshot: str | None = None,
    verbose: bool = False,
    distributed: dict[str, Any] | None = None,
) -> None:
    from rich.console import Console

    from peakmem.estimate import EstimateError, estimate_command
    from peakmem.profiles import ProfileError, load_gpu, load_stack

    try:
        gpu_profile = load_gpu(gpu)
        if torch_version:
            load_stack(torch_version)
    except ProfileError as exc:
        report(EstimateError(str(exc), exit_code=2, reason="bad_input"), as_json)
    if emit_request is not None:
        _check_emit(emit_request, gpu_profile, as_json)
    from peakmem.cli.output_paths import empty_output

    empty = empty_output({"--job-log": job_log, "--snapshot": snapshot, "--timeline": timeline})
    if empty:
        report(EstimateError(empty, exit_code=2, reason="bad_input"), as_json)
    # paths the user gave are peakmem's, resolved before the job runs
    timeline = os.path.abspath(timeline) if timeline else None
    job_log = os.path.abspath(job_log) if job_log else None
    if timeline and not os.path.isdir(os.path.dirname(timeline)):
        report(EstimateError(f"cannot write the timeline {timeline}: no such directory",
                             exit_code=2, reason="bad_input"), as_json)
    if timeline and not timeline.lower().endswith((".html", ".htm", ".png")):
        report(EstimateError(f"a timeline is an .html or .png file, not {timeline}",
                             exit_code=2, reason="bad_input"), as_json)
    snapshot = os.path.abspath(snapshot) if snapshot else None
    if snapshot and not os.path.isdir(os.path.dirname(snapshot)):
        report(EstimateError(f"cannot write the snapshot {snapshot}: no such directory",
                             exit_code=2, reason="bad_input"), as_json)
    from peakmem.cli.output_paths import clobbered_input, fifo_without_reader

    for flag, output in (("--job-log", job_log), ("--snapshot", snapshot),
                         ("--timeline", timeline)):
        clobbered = clobbered_input(output, command) if output else None
        if clobbered:
            report(EstimateError(f"{flag} {output} would overwrite {clobbered}", exit_code=2,
                                 reason="bad_input"), as_json)
        if output and flag != "--job-log" and fifo_without_reader(output):
            report(EstimateError(f"cannot write {flag} {output}: a FIFO that no process reads",
                                 exit_code=2, reason="bad_input"), as_json)
    from peakmem.cli.output_paths import shared_output

    shared = shared_output({"--job-log": job_log, "--snapshot": snapshot, "--timeline": timeline})
    if shared:
        report(EstimateError(shared, exit_code=2, reason="bad_input"), as_json)

    from peakmem.jobs.sandbox import SandboxUnavailable, sandbox_for_cli

    try:
        job_sandbox = sandbox_for_cli(sandbox)
    except SandboxUnavailable as exc:
        report(EstimateError(str(exc), exit_code=exc.exit_code, reason="sandbox_unavailable"),
               as_json)

    # A spinner only while the job's output goes to a file: its writes to the terminal (file
    # descriptor 2, from another process) would cut through the spinner's line.
    status_console = Console(stderr=True)
    spinner = (
        status_console.status(f"Running the job on a fake {gpu_profile.device_name} (mode {mode})...")
        if job_log
        else contextlib.nullcontext()
    )
    try:
        with spinner:
            result = estimate_command(
                list(command),
                gpu=gpu_profile,
                torch_version=torch_version,
                alloc_conf=alloc_conf,
                steps=steps,
                mode=mode,
                timeout=timeout,
                timeline=bool(timeline),
                max_host_memory=max_host_memory,
                job_log=job_log,
                sandbox=job_sandbox,
                **(distributed or {}),
            )
    except EstimateError as exc:
        report(exc, as_json)
    except ProfileError as exc:
        report(EstimateError(str(exc), exit_code=2, reason="bad_input"), as_json)

    if timeline:
        from peakmem.estimate.timeline import write_timeline

        try:
            write_timeline(result, timeline)
        except (OSError, ValueError) as exc:
            report(EstimateError(f"cannot write the timeline {timeline}: {exc}", exit_code=2,
                                 reason="bad_input"), as_json)
    from peakmem.estimate.fallbacks import gpu_alias_note

    alias = gpu_alias_note(gpu, gpu_profile)
    if alias:
        result.notes.insert(0, alias)
    if snapshot:
        from peakmem.estimate.memory_snapshot import write_snapshot

        try:
            write_snapshot(result, snapshot)
        except OSError as exc:
            report(EstimateError(f"cannot write the snapshot {snapshot}: {exc}", exit_code=2,
                                 reason="bad_input"), as_json)
    if emit_request is not None:
        _print_emit(result.to_json(), emit_request, as_json)
        return
    if as_json:
        click.echo(json.dumps(result.to_json()))
    else:
        from peakmem.estimate.report import render

        render(result, Console(), verbose=verbose)
        if timeline:
            # the user's path, as it is: no markup, no line breaks inserted (it is copied)
            Console().print(f"timeline written to {timeline}", markup=False, soft_wrap=True)
        if snapshot:
            Console().print(f"snapshot written to {snapshot} (open it at "
                            "https://pytorch.org/memory_viz)", markup=False, soft_wrap=True)


def _emit_request(
    emit: str | None,
    pairs: tuple[str, ...],
    mib_per_shard: int | None,
    command: tuple[str, ...],
    as_json: bool,
) -> tuple[str, dict[str, Any]] | None:
    """(format, options) of `--emit`, checked before the job runs (exit 2 if malformed)."""
    if emit is None:
        if pairs or mib_per_shard is not None:
            _emit_failure("--emit-option and --mib-per-shard need --emit FORMAT", as_json)
        return None
    from peakmem.cli.contract import BadInput
    from peakmem.cli.emit_options import parse_emit_options

    try:
        options = parse_emit_options(pairs, mib_per_shard)
    except BadInput as exc:
        _emit_failure(str(exc), as_json)
    options.setdefault("command", list(command))
    script = next((a for a in command[1:] if not a.startswith("-")), "peakmem-job")
    name = os.path.basename(script)
    options.setdefault("name", name[:-3] if name.endswith(".py") else name.rsplit(".", 1)[-1])
    return emit.lower(), options


def _emit_failure(message: str, as_json: bool) -> NoReturn:
    from peakmem.estimate.api import EstimateError

    report(EstimateError(message, exit_code=2, reason="bad_input"), as_json)


def _check_emit(emit_request: tuple[str, dict[str, Any]], gpu: Any, as_json: bool) -> None:
    """Refuse, before the job runs, an --emit the estimate could never satisfy (a format option
    it does not take, slurm without a shard size, MIG on a GPU without it): a 1-byte job on the
    same GPU must be expressible."""
    from peakmem.schedule.emit import EmitError, render

    fmt, options = emit_request
    tiny = {"peak_bytes": 1, "peak_bytes_with_margin": 1, "peak_reserved_bytes": 1,
            "capacity_bytes": gpu.total_memory_bytes, "gpu": gpu.name}
    try:
        render(tiny, fmt, **options)
    except EmitError as exc:
        _emit_failure(f"cannot emit {fmt}: {exc}", as_json)


def _print_emit(estimate: dict[str, Any], emit_request: tuple[str, dict[str, Any]],
                as_json: bool) -> None:
    """`--emit`: the scheduler's snippet instead of the table (under "emit" with --json)."""
    from peakmem.schedule.emit import EmitError, render

    fmt, options = emit_request
    try:
        snippet = render(estimate, fmt, **options)
    except EmitError as exc:
        _emit_failure(f"cannot emit {fmt}: {exc}", as_json)
    if as_json:
        click.echo(json.dumps({**estimate, "emit": snippet, "emit_format": fmt}))
    else:
        click.echo(snippet)

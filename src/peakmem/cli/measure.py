"""`peakmem measure [options] -- python train.py [args]`: ground truth on a real GPU."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from peakmem.cli.contract import ContractUsage, error_object
from peakmem.cli.finite import FiniteFloatRange
from peakmem.jobs.runner import JobSpec, JobSpecError
from peakmem.measure.probe import DeviceProbe
from peakmem.measure.result import MeasureResult, MeasureStatus
from peakmem.measure.session import MeasureOptions, NoGPUError, measure_job


def _output_path(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """An output file option as a Path; '' refused (Path('') is the current directory)."""
    from peakmem.cli.output_paths import refuse_empty

    return None if value is None else Path(refuse_empty(ctx, param, value))


_EXIT_CODES = {MeasureStatus.OK: 0, MeasureStatus.OOM: 0, MeasureStatus.TIMEOUT: 124}


def make_probe(index: int) -> DeviceProbe:
    """The real NVML + torch.cuda probe (tests replace this function)."""
    from peakmem.measure.cuda_probe import CudaProbe

    return CudaProbe(index)


@click.command(
    "measure",
    cls=ContractUsage,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--steps",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Stop the job after this many optimizer steps.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (the job's own prints go to stderr).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    callback=_output_path,
    help="Also write the JSON object to this file.",
)
@click.option(
    "--snapshot",
    type=click.Path(dir_okay=False),
    callback=_output_path,
    help="Record the allocator's history and dump a memory snapshot (pickle) here.",
)
@click.option(
    "--snapshot-stacks",
    type=click.Choice(["python", "all"]),
    default="python",
    show_default=True,
    help="Stack frames recorded per allocation (all: with C++).",
)
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0, min_open=True),
    help="Stop the job after this many seconds (status timeout).",
)
@click.option(
    "--hz",
    "sample_hz",
    default=200.0,
    show_default=True,
    type=FiniteFloatRange(min=100),
    help="NVML sampling rate.",
)
@click.option(
    "--device-index",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="The GPU (torch index) the job uses.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def measure(
    steps: int,
    as_json: bool,
    out: Path | None,
    snapshot: Path | None,
    snapshot_stacks: str,
    timeout: float | None,
    sample_hz: float,
    device_index: int,
    command: tuple[str, ...],
) -> None:
    """Run `python train.py [args]` (or `python -m module`) for N optimizer steps on the GPU and
    record its peak memory: NVML device-level peak, torch's max reserved/allocated, the CUDA
    context, versions and allocator config."""
    from peakmem.jobs.launchers import LaunchError, parse_launch

    try:  # `env NAME=VALUE python ...`, `nohup python ...`: the launch parsing takes them off
        launch = parse_launch(command)
        if launch is not None and launch.distributed:
            raise JobSpecError("peakmem measure runs one process: give `python train.py`, "
                               "not a distributed launch")
        spec = JobSpec.parse(launch.command if launch is not None else command)
        if spec.script is not None and not Path(spec.script).is_file():
            raise JobSpecError(f"script not found: {spec.script}")
    except (JobSpecError, LaunchError) as exc:
        raise click.UsageError(str(exc)) from None
    from peakmem.cli.output_paths import clobbered_input, fifo_without_reader

    for flag, output in (("--out", out), ("--snapshot", snapshot)):
        clobbered = clobbered_input(os.path.abspath(output), command) if output else None
        if clobbered:
            raise click.UsageError(f"{flag} {output} would overwrite {clobbered}")
        if output and fifo_without_reader(output):
            raise click.UsageError(f"cannot write {flag} {output}: a FIFO that no process reads")
    from peakmem.cli.output_paths import shared_output

    shared = shared_output({"--out": out, "--snapshot": snapshot})
    if shared:
        raise click.UsageError(shared)
    if launch is not None:
        os.environ.update(launch.env)  # this process is the job's: set before CUDA starts
    options = MeasureOptions(
        steps=steps,
        timeout=timeout,
        sample_hz=sample_hz,
        snapshot=snapshot,
        snapshot_stacks=snapshot_stacks,
        job_stdout=sys.stderr if as_json else None,
    )
    try:
        probe = make_probe(device_index)
        try:
            result = measure_job(spec, probe, options)
        finally:
            probe.close()
    except NoGPUError as exc:
        if as_json:  # the contract's one JSON object, as for every other refusal
            click.echo(json.dumps(error_object("bad_input", f"no CUDA GPU to measure on: {exc}",
                                               2, reason="no_gpu")))
        click.echo(f"peakmem measure: no CUDA GPU to measure on: {exc}", err=True)
        sys.exit(2)
    data = result.to_json()
    if result.peak_unknown:
        click.echo(f"peakmem measure: the peak is unknown: {result.peak_unknown}", err=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
    if as_json:
        click.echo(json.dumps(data))
    else:
        _print_table(result)
    sys.exit(_EXIT_CODES.get(result.status, result.exit_code or 1))


def _mib(value: int) -> str:
    return f"{value / 2**20:,.1f} MiB"


_SHOWN_CHARS = 500
"""The most characters of one user string (the job's command, an error, a path) in the table."""


def _plain(text: str):
    """A user string (module names, paths, the job's command, its error) as one line of plain
    text: rich markup in it (`[/x]` raised MarkupError after the job had run on the GPU,
    `[bold]` restyled it) and line breaks or bidi overrides (they could forge rows) shown as
    they are, escaped."""
    from rich.text import Text

    from peakmem.inputs import one_line

    return Text(one_line(text, _SHOWN_CHARS))


def measure_table(result: MeasureResult):
    """The text report of one measurement: a rich Table whose user strings are plain text."""
    from rich.table import Table

    table = Table(title=_plain(f"peakmem measure: {result.job}"), show_header=False)
    rows = [
        ("status", str(result.status) + (f" ({result.error})" if result.error else "")),
        ("peak (device, NVML)", _mib(result.peak_bytes) if not result.peak_unknown else "unknown"),
        ("max reserved", _mib(result.peak_reserved_bytes)),
        ("max allocated", _mib(result.peak_allocated_bytes)),
        ("context + libraries", _mib(result.context_bytes)),
        ("steps", f"{result.steps} of {result.steps_requested}"),
        ("seconds", f"{result.seconds:.2f}"),
        ("gpu", f"{result.gpu} (driver {result.driver}, CUDA {result.cuda}, torch {result.torch})"),
        ("allocator config", result.alloc_conf or "(default)"),
        (
            "sampling",
            f"{result.samples} samples at {result.sample_hz:.0f} Hz ({result.peak_source})",
        ),
    ]
    if result.peak_resets:
        rows.append(("peak counter resets",
                     f"{result.peak_resets} by the job (max reserved / allocated: the whole run's)"))
    if result.snapshot:
        rows.append(("snapshot", result.snapshot))
    for name, value in rows:
        table.add_row(name, _plain(value))
    return table


def _print_table(result: MeasureResult) -> None:
    from rich.console import Console

    Console().print(measure_table(result))

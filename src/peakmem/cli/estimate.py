"""`peakmem estimate [options] -- python train.py [args]`."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from peakmem.cli.steps_option import STEPS


@click.command(
    "estimate",
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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--timeline",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a memory timeline (.html or .png).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds before the job is stopped.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def estimate_cmd(
    gpu: str,
    torch_version: str | None,
    alloc_conf: str | None,
    steps: int | None,
    mode: str,
    as_json: bool,
    timeline: str | None,
    timeout: float | None,
    command: tuple[str, ...],
) -> None:
    """Estimate the peak GPU memory of a training script, on this machine, without a GPU."""
    from rich.console import Console

    from peakmem.estimate import EstimateError, estimate_command
    from peakmem.jobs.runner import JobSpec, JobSpecError
    from peakmem.profiles import ProfileError, load_gpu, load_stack

    try:
        gpu_profile = load_gpu(gpu)
        if torch_version:
            load_stack(torch_version)
        spec = JobSpec.parse(list(command))
        if spec.script is not None and not Path(spec.script).is_file():
            raise JobSpecError(f"script not found: {spec.script}")
    except ProfileError as exc:
        raise click.BadParameter(str(exc)) from None
    except JobSpecError as exc:
        raise click.UsageError(str(exc)) from None

    status_console = Console(stderr=True)
    # With --json, stdout carries only the JSON object: the job's own prints go to stderr.
    job_stdout = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    try:
        with (
            status_console.status(
                f"Running the job on a fake {gpu_profile.device_name} (mode {mode})..."
            ),
            job_stdout,
        ):
            result = estimate_command(
                list(command),
                gpu=gpu_profile,
                torch_version=torch_version,
                alloc_conf=alloc_conf,
                steps=steps,
                mode=mode,
                timeout=timeout,
                timeline=bool(timeline),
            )
    except EstimateError as exc:
        click.echo(str(exc).rstrip(), err=True)
        if exc.capture is not None and not str(exc).startswith("peakmem:"):
            click.echo("peakmem: the job failed; no estimate.", err=True)
        sys.exit(exc.exit_code or 1)

    if timeline:
        from peakmem.estimate.timeline import write_timeline

        try:
            write_timeline(result, timeline)
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"cannot write the timeline: {exc}") from None
    if as_json:
        click.echo(json.dumps(result.to_json()))
    else:
        from peakmem.estimate.report import render

        render(result, Console())
        if timeline:
            Console().print(f"timeline written to {timeline}")

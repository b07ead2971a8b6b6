"""`peakmem fit --gpu rtx4090 --arg batch_size=1..4096 -- python train.py --batch-size {batch_size}`.

The largest value of one integer argument whose estimate (with the safety margin) fits each GPU,
from a few estimates (`peakmem.estimate.fit_search`). Each estimate runs the job in its own
supervised child, as `peakmem estimate` does; failures follow the same contract.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import click

from peakmem.cli.estimate import _EstimateCommand, _Seconds, internal_error, report
from peakmem.cli.steps_option import STEPS


@click.command(
    "fit",
    cls=_EstimateCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--gpu", "gpus", default="h100-80gb", show_default=True,
              help="Target GPU profile(s), comma-separated: one answer per GPU.")
@click.option("--arg", "arg_spec", required=True, metavar="NAME=LOW..HIGH",
              help="The integer knob and its range, e.g. batch_size=1..4096; the command names "
              "it as {NAME}.")
@click.option("--torch", "torch_version", default=None,
              help="Target PyTorch version [default: installed].")
@click.option("--alloc-conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF of the target run.")
@click.option("--steps", default=None, type=STEPS,
              help="Optimizer steps per estimate (as for `peakmem estimate`).")
@click.option("--mode", type=click.Choice(["fake", "eager", "auto"]), default="auto",
              show_default=True, help="Capture mode of each estimate (see `peakmem estimate`).")
@click.option("--timeout", type=_Seconds(), default=None,
              help="Wall-clock seconds allowed to EACH estimate; exit 124 past it.")
@click.option("--job-log", type=click.Path(dir_okay=False), default=None,
              help="Write the job's stdout and stderr to this file (each estimate overwrites it: "
              "it holds the last one's) [default: discarded; a failing job's traceback is still "
              "shown].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (also on failure).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def fit_cmd(gpus: str, arg_spec: str, torch_version: str | None, alloc_conf: str | None,
            steps: Any, mode: str, timeout: float | None, job_log: str | None, as_json: bool,
            command: tuple[str, ...]) -> None:
    """The largest value of a script argument (batch size, sequence length...) that fits each
    GPU, with the safety margin, from a few estimates."""
    try:
        _fit(gpus, arg_spec, torch_version, alloc_conf, steps, mode, timeout, job_log, as_json,
             command)
    except (SystemExit, KeyboardInterrupt, click.exceptions.Exit, click.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - a bug in peakmem: exit 70 with its frames
        report(internal_error(exc), as_json)


def _bad(message: str, as_json: bool) -> None:
    from peakmem.estimate.api import EstimateError

    report(EstimateError(message, exit_code=2, reason="bad_input"), as_json)


def _fit(gpus: str, arg_spec: str, torch_version: str | None, alloc_conf: str | None,
         steps: Any, mode: str, timeout: float | None, job_log: str | None, as_json: bool,
         command: tuple[str, ...]) -> None:
    from rich.console import Console

    from peakmem.estimate.api import EstimateError
    from peakmem.estimate.fit_search import FitSpecError, fit_command, parse_arg_range
    from peakmem.profiles import ProfileError, load_gpu, load_stack

    try:
        knob = parse_arg_range(arg_spec)
        knob.check_command(command)
    except FitSpecError as exc:
        _bad(str(exc), as_json)
    names = [name.strip() for name in gpus.split(",") if name.strip()]
    if not names:
        _bad("--gpu names no GPU", as_json)
    try:
        profiles = list({p.name: p for p in (load_gpu(name) for name in names)}.values())
        if torch_version:
            load_stack(torch_version)
    except ProfileError as exc:
        _bad(str(exc), as_json)

    from peakmem.cli.output_paths import clobbered_input, empty_output

    if empty := empty_output({"--job-log": job_log}):
        _bad(empty, as_json)
    log_path = os.path.abspath(job_log) if job_log else None

    clobbered = clobbered_input(log_path, command) if log_path else None
    if clobbered:
        _bad(f"--job-log {log_path} would overwrite {clobbered}", as_json)
    if log_path is None:  # discarded (a scratch file kept it all: 10 GB printed, 10 GB of /tmp)
        log_path = os.devnull
    console = Console(stderr=True)
    estimates = 0
    started = time.monotonic()
    answers: list[Any] = []
    try:
        status = console.status("") if console.is_terminal else contextlib.nullcontext()
        with status as spinner:

            def progress(gpu: str, value: int, count: int) -> None:
                nonlocal estimates
                estimates = count
                text = f"{gpu}: estimate {count}, {knob.name}={value} ..."
                if spinner is not None:
                    spinner.update(text)
                elif not as_json:
                    console.print(text, markup=False)

            answers = fit_command(
                command, knob, profiles, on_probe=progress, torch_version=torch_version,
                alloc_conf=alloc_conf, steps=steps, mode=mode, timeout=timeout,
                job_log=log_path,
            )
    except EstimateError as exc:
        report(exc, as_json)
    except ProfileError as exc:
        _bad(str(exc), as_json)
    seconds = time.monotonic() - started
    if as_json:
        click.echo(json.dumps({
            "arg": knob.name,
            "results": [answer.to_json() for answer in answers],
        }))
        return
    out = Console()
    _render(knob.name, knob.low, knob.high, answers, estimates, seconds, out)
    from peakmem.estimate.fallbacks import gpu_alias_note

    for note in dict.fromkeys(gpu_alias_note(name, load_gpu(name)) for name in names):
        if note:
            out.print(f"note: {note}", markup=False)


def _render(name: str, low: int, high: int, answers: list[Any], estimates: int, seconds: float,
            console: Any) -> None:
    from rich.table import Table

    from peakmem.estimate.report import human_bytes

    table = Table(title=f"Largest {name} in {low}..{high} that fits (with the safety margin)",
                  title_justify="left")
    table.add_column("GPU")
    table.add_column("capacity", justify="right")
    table.add_column(name, justify="right")
    table.add_column("peak (with margin)", justify="right")
    table.add_column(f"{name} + 1", justify="right")
    table.add_column("its peak", justify="right")
    for answer in answers:
        value = "[red]none fits[/red]" if answer.value is None else str(answer.value)
        nxt = "(top of range)" if answer.next_value is None else str(answer.next_value)
        table.add_row(
            answer.gpu,
            human_bytes(answer.capacity_bytes),
            value,
            "" if answer.peak_bytes_with_margin is None else human_bytes(answer.peak_bytes_with_margin),
            nxt,
            "" if answer.next_peak_bytes_with_margin is None
            else human_bytes(answer.next_peak_bytes_with_margin),
        )
    console.print(table)
    console.print(f"{estimates} estimate(s) in {seconds:.1f} s", markup=False)

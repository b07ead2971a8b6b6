"""`peakmem pack`: place jobs on a GPU inventory by their estimates (peakmem.schedule.pack).

    peakmem pack runs/*.json --gpus 8xa100-40gb,2xl4
    peakmem pack --jobs jobs.jsonl --gpus 4xh100-80gb:3g.40gb+2g.20gb+2g.20gb --json
    peakmem pack runs/*.json --what-if
    peakmem pack runs/*.json --gpus 2xa100-40gb --emit hami
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import click

from peakmem.cli.contract import BadInput, ContractCommand, report_error
from peakmem.cli.emit_options import emit_options, parse_emit_options


class _Float(click.ParamType):
    name = "number"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        import math

        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not (math.isfinite(number) and number > 0):
            self.fail(f"{value!r} is not a finite positive number", param, ctx)
        return number


@click.command("pack", cls=ContractCommand)
@click.argument("estimates", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--jobs", "jobs_file", type=click.Path(dir_okay=False), default=None,
              help="A jobs file (JSON lines: id, command, gpu?, options?) that peakmem estimates.")
@click.option("--gpus", default=None, metavar="INVENTORY",
              help="GPUs and MIG slices, e.g. 8xa100-40gb,2xl4,7xa100-80gb/1g.10gb,"
              "h100-80gb:3g.40gb+2g.20gb+2g.20gb (README: pack).")
@click.option("--policy", type=click.Choice(["first-fit", "best-fit-decreasing", "utilization-aware"]),
              default="best-fit-decreasing", show_default=True, help="How jobs are placed.")
@click.option("--max-smact", type=_Float(), default=1.0, show_default=True,
              help="utilization-aware: the most summed predicted SM activity per GPU.")
@click.option("--what-if", is_flag=True,
              help="Which single GPU type holds all of the jobs, and how many of it (of the "
              "--gpus types, or of every known GPU).")
@click.option("--timeout", type=_Float(), default=None,
              help="--jobs: wall-clock seconds for each job's estimate.")
@click.option("--sandbox", is_flag=True,
              help="--jobs: run each job as `peakmem estimate --sandbox` does (exit 3 where it "
              "cannot be provided).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (also on failure).")
@emit_options
def pack(
    estimates: tuple[str, ...],
    jobs_file: str | None,
    gpus: str | None,
    policy: str,
    max_smact: float,
    what_if: bool,
    timeout: float | None,
    sandbox: bool,
    as_json: bool,
    emit: str | None,
    emit_option: tuple[str, ...],
    mib_per_shard: int | None,
) -> None:
    """Place jobs on GPUs (or MIG slices) by their estimated peak memory with its margin."""
    from peakmem.schedule.emit import EmitError
    from peakmem.schedule.inventory import Bin, InventoryError, parse_inventory
    from peakmem.schedule.jobs import estimate_jobs_file, load_estimate_files
    from peakmem.schedule.pack import PackError
    from peakmem.schedule.pack import pack as place
    from peakmem.schedule.pack import what_if as what_if_gpus

    if not estimates and not jobs_file:
        raise BadInput("give estimate JSON files (peakmem estimate --json) or --jobs FILE")
    if gpus is None and not what_if:
        raise BadInput("--gpus is required (e.g. --gpus 8xa100-40gb,2xl4), or use --what-if")
    options = parse_emit_options(emit_option, mib_per_shard)
    try:
        bins: list[Bin] = parse_inventory(gpus) if gpus is not None else []
        if emit:
            check_emit(emit, options, bins)
        jobs = load_estimate_files(list(estimates))
        failed = []
        commands: dict[str, list[str]] = {}
        if jobs_file:
            from peakmem.estimate.api import DEFAULT_GPU
            from peakmem.jobs.sandbox import SandboxUnavailable, sandbox_for_cli
            from peakmem.schedule.jobs import read_jobs_file

            default_gpu = bins[0].gpu if bins else DEFAULT_GPU
            commands = {e["id"]: list(e["command"]) for e in read_jobs_file(jobs_file)}
            try:
                job_sandbox = sandbox_for_cli(sandbox)
            except SandboxUnavailable as exc:
                report_error("unsupported", str(exc), exc.exit_code, as_json)
            estimated, failed = estimate_jobs_file(
                jobs_file, default_gpu, timeout=timeout, sandbox=job_sandbox,
                on_job=lambda job_id: click.echo(f"peakmem: estimating {job_id}...", err=True),
            )
            jobs += estimated
        names = [job.name for job in jobs] + [job.name for job, _ in failed]
        dupes = sorted(name for name, count in Counter(names).items() if count > 1)
        if dupes:
            raise BadInput(f"two jobs share the name {dupes[0]!r}; rename one")
        if what_if:
            types = list(dict.fromkeys(b.gpu for b in bins if b.mig is None)) if bins else None
            if types is None:
                from peakmem.profiles import known_gpus

                types = known_gpus()
            if not types:
                raise BadInput("--what-if compares whole GPU types; --gpus names only MIG slices")
            answers = what_if_gpus(jobs, types, policy, max_smact=max_smact)
            _print_what_if(answers, failed, policy, as_json)
            return
        placement = place(jobs, bins, policy, max_smact=max_smact)
    except (InventoryError, EmitError) as exc:
        raise BadInput(str(exc)) from None
    except PackError as exc:
        kind = {3: "unsupported"}.get(exc.exit_code, "bad_input")
        report_error(kind, str(exc), exc.exit_code, as_json)
    placement.rejected.extend(failed)
    snippets, emit_errors = _emit(placement, emit, options, commands) if emit else ({}, {})
    if emit_errors and not snippets:  # not one request printed: a failure, not an empty output
        name, message = next(iter(emit_errors.items()))
        raise BadInput(f"cannot emit {emit} for {_safe(name)}: {message}")
    if as_json:
        data = placement.to_json()
        if emit:
            data["emit"] = snippets
            data["emit_format"] = emit
            if emit_errors:
                data["emit_errors"] = emit_errors
        click.echo(json.dumps(data))
        return
    if emit:
        _print_snippets(emit, snippets, emit_errors)
        return
    _print_placement(placement)


def check_emit(fmt: str, options: dict[str, Any], bins: Sequence[Any]) -> None:
    """EmitError, before any job is read or estimated, for an --emit that no job could satisfy
    on these GPUs (an option the format does not take, slurm without a shard size, a command
    that is not a list): a 1-byte job on each kind of GPU or slice must be expressible."""
    from peakmem.schedule.emit import EmitError, render

    kinds = {(b.gpu, b.mig, b.capacity_bytes) for b in bins} or {(None, None, None)}
    for gpu, mig, capacity in sorted(kinds, key=str):
        opts: dict[str, Any] = {"name": "check"}
        if gpu is not None:
            opts.update(gpu=gpu, capacity_bytes=capacity)
        if mig and fmt in ("k8s-mig", "slurm"):
            opts["mig"] = mig
        opts.update(options)
        tiny = {"peak_bytes": 1, "peak_bytes_with_margin": 1, "peak_reserved_bytes": 1}
        try:
            render(tiny, fmt, **opts)
        except EmitError as exc:
            raise EmitError(f"cannot emit {fmt}: {exc}") from None


def _emit(placement: Any, fmt: str, options: dict[str, Any], commands: dict[str, list[str]]):
    from peakmem.schedule.emit import EmitError, render

    snippets: dict[str, str] = {}
    errors: dict[str, str] = {}
    for load in placement.bins:
        for job in load.jobs:
            opts = {"gpu": load.bin.gpu, "capacity_bytes": load.bin.capacity_bytes, "name": job.name}
            if load.bin.mig and fmt in ("k8s-mig", "slurm"):
                opts["mig"] = load.bin.mig
            if job.name in commands:
                opts["command"] = commands[job.name]
            opts.update(options)
            try:
                snippets[job.name] = render(job.estimate or {}, fmt, **opts)
            except EmitError as exc:
                errors[job.name] = str(exc)
    return snippets, errors


def _safe(name: str) -> str:
    """A job name on one line of plain text (names come from untrusted files)."""
    return "".join(c if c.isprintable() else "?" for c in name)


def _print_snippets(fmt: str, snippets: dict[str, str], errors: dict[str, str]) -> None:
    kubernetes = fmt in ("hami", "volcano", "kai", "runai", "k8s-mig")
    parts = []
    for name, text in snippets.items():
        parts.append(text if kubernetes else f"# {_safe(name)}\n{text}")
    click.echo(("\n---\n" if kubernetes else "\n\n").join(parts))
    for name, message in errors.items():
        click.echo(f"peakmem: cannot emit {fmt} for {_safe(name)}: {message}", err=True)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _risk(value: float | None) -> str:
    return "unknown" if value is None else f"{100 * value:.2f}%"


def _print_placement(placement: Any) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=f"placement ({placement.policy})")
    for column in ("#", "GPU / slice", "device", "jobs", "with margin", "capacity", "used", "OOM risk"):
        right = column not in ("GPU / slice", "jobs")
        table.add_column(column, justify="right" if right else "left",
                         overflow="fold", no_wrap=column == "GPU / slice")
    for load in placement.bins:
        table.add_row(
            str(load.index), load.bin.label, str(load.bin.device),
            escape(", ".join(_safe(job.name) for job in load.jobs)), _gib(load.bytes_with_margin),
            _gib(load.bin.capacity_bytes),
            f"{100 * load.bytes_with_margin / load.bin.capacity_bytes:.0f}%", _risk(load.oom_risk),
        )
    console.print(table)
    console.print(
        f"GPUs/slices used: {len(placement.bins)} of {placement.inventory}; expected OOM-hit "
        f"GPUs {'unknown' if placement.expected_oom_bins is None else f'{placement.expected_oom_bins:.3f}'}, "
        f"chance of any OOM {_risk(placement.oom_risk_any)} (calibrated margins: <=1% of jobs each)"
    )
    for job, why in placement.rejected:
        console.print(f"[red]rejected[/red] {escape(_safe(job.name))}: {escape(_safe(why))}",
                      highlight=False)
    for note in placement.notes:
        console.print(f"note: {escape(_safe(note))}", highlight=False)


def _print_what_if(answers: list[Any], failed: list[Any], policy: str, as_json: bool) -> None:
    if as_json:
        best = next((a.gpu for a in answers if a.count is not None), None)
        click.echo(json.dumps({
            "what_if": [a.to_json() for a in answers],
            "best": best,
            "policy": policy,
            "rejected": [{"job": job.name, "why": why} for job, why in failed],
        }))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"which single GPU type holds all the jobs ({policy})")
    for column in ("GPU", "count", "capacity each", "does not fit"):
        table.add_column(column)
    for a in answers:
        table.add_row(
            a.gpu, "-" if a.count is None else str(a.count), _gib(a.capacity_bytes),
            escape(", ".join(_safe(job.name) for job, _ in a.rejected)),
        )
    console = Console()
    console.print(table)
    for job, why in failed:
        console.print(f"[red]rejected[/red] {escape(_safe(job.name))}: {escape(_safe(why))}",
                      highlight=False)

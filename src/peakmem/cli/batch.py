"""`peakmem batch JOBS.jsonl`: many estimates at once on Ray, results streamed to JSON lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from peakmem.cli.contract import BadInput, ContractCommand
from peakmem.cli.finite import FiniteFloatRange
from peakmem.inputs import one_line


@click.command("batch", cls=ContractCommand)
@click.argument("jobs", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Results file, appended to [default: JOBS with .results.jsonl].")
@click.option("--ray-address", default=None, metavar="ADDRESS",
              help="Ray cluster to run on (ray://host:10001 or auto) [default: start a local Ray].")
@click.option("--workers", type=click.IntRange(1, 4096), default=None,
              help="Estimates at once on the local Ray [default: CPU cores].")
@click.option("--in-process", is_flag=True,
              help="Run the jobs one after another in this process, without Ray.")
@click.option("--retry-failed", is_flag=True,
              help="Rerun jobs that failed in an earlier run (default: only those not final).")
@click.option("--sandbox", is_flag=True, help="Run each job in peakmem's sandbox (SECURITY.md).")
@click.option("--max-seconds", type=FiniteFloatRange(0, 86400, min_open=True), default=None,
              help="Wall-clock limit of one estimate.")
@click.option("--max-host-memory", default=None, metavar="BYTES",
              help="Host RAM one job may hold (e.g. 8GiB).")
@click.option("--estimator", default=None, metavar="MODULE:FUNCTION",
              help="Run estimates with this callable instead of `peakmem estimate` (testing).")
@click.option("--job-nice", default=10, show_default=True, type=click.IntRange(0, 19),
              help="Niceness added to each job's worker process (as `peakmem serve "
              "--job-nice`), so that estimates (CPU-bound) yield to the rest of the machine; 0 "
              "runs them at this process's priority.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def batch(jobs: str, output: str | None, ray_address: str | None, workers: int | None,
          in_process: bool, retry_failed: bool, sandbox: bool, max_seconds: float | None,
          max_host_memory: str | None, estimator: str | None, job_nice: int,
          as_json: bool) -> None:
    """Estimate every job of JOBS.jsonl (one JSON object a line: id, command, files or cwd, gpu,
    options) on Ray; results stream to a JSON-lines file, and a rerun skips the finished ids."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from peakmem.cli.common import parse_bytes
    from peakmem.service.jobs import load_estimator

    try:
        from peakmem.service.batch import BatchInputError, BatchSettings, run_batch
    except ImportError as exc:
        raise BadInput(f"`peakmem batch` needs the service extra (pip install "
                       f"'peakmem[service]'): {exc}") from None

    jobs_path = Path(jobs)
    from peakmem.cli.output_paths import empty_output

    if empty := empty_output({"-o/--output": output}):  # '' was taken for the default file
        raise BadInput(empty)
    if not jobs_path.is_file():
        raise BadInput(_not_a_jobs_file(jobs))
    output_path = Path(output) if output else jobs_path.with_name(
        jobs_path.name.removesuffix(".jsonl") + ".results.jsonl")
    if in_process and ray_address:
        raise BadInput("--in-process and --ray-address exclude each other")
    if estimator:
        try:
            load_estimator(estimator)
        except (ImportError, AttributeError, ValueError) as exc:
            raise BadInput(f"--estimator {estimator!r}: {exc}") from None
    if sandbox:
        from peakmem.jobs.sandbox import SandboxUnavailable, sandbox_for_cli

        try:
            sandbox_for_cli(True)
        except SandboxUnavailable as exc:
            click.echo(str(exc), err=True)
            raise SystemExit(exc.exit_code) from None
    if not in_process:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise BadInput("Ray is not installed (pip install 'peakmem[service]'), or use "
                           "--in-process") from None
    settings = BatchSettings(
        estimator=estimator, sandbox=sandbox, max_seconds=max_seconds, job_nice=job_nice,
        max_host_memory=parse_bytes(max_host_memory, "--max-host-memory") if max_host_memory
        else None,
    )
    console = Console(stderr=True)
    progress = Progress(TextColumn("[bold]estimates"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                        console=console, transient=False)
    task = progress.add_task("batch", total=None, failed=0)
    failed = 0

    def on_start(total: int) -> None:  # the jobs file was read: a bad one prints no bar
        progress.update(task, total=total)
        progress.start()

    def on_result(line: dict) -> None:
        nonlocal failed
        failed += line["status"] != "done"
        progress.update(task, advance=1, failed=failed)

    def stop_progress() -> None:  # a bar never started: rich's stop() prints a blank line
        if progress.live.is_started:
            progress.stop()

    try:
        summary = run_batch(
            jobs_path, output_path, settings, ray_address=ray_address, workers=workers,
            in_process=in_process, retry_failed=retry_failed,
            on_start=on_start, on_result=on_result,
        )
    except BatchInputError as exc:
        raise BadInput(str(exc)) from None
    finally:
        stop_progress()
    if as_json:
        click.echo(json.dumps({"total": summary.total, "skipped": summary.skipped,
                               "done": summary.done, "failed": summary.failed,
                               "seconds": round(summary.seconds, 3), "output": str(output_path)}))
    else:
        console.print(f"{summary.done} done, {summary.failed} failed, {summary.skipped} already "
                      f"finished, in {summary.seconds:.1f} s; results in {output_path}",
                      markup=False, highlight=False)  # the path is the user's: `[/x]` is no markup
        for line in summary.failures[:10]:  # an id and a message the job file chose: plain
            console.print(f"  failed {one_line(line)}", markup=False, highlight=False)


def _not_a_jobs_file(jobs: str) -> str:
    """Why `jobs` (not a regular file) cannot be read: missing, or what it is instead (a FIFO
    was called missing)."""
    from peakmem.inputs import InputError, open_regular_file

    if not os.path.lexists(jobs):
        return f"no such jobs file: {jobs}"
    try:
        open_regular_file(jobs).close()
    except InputError as exc:
        return f"the jobs file {exc}"
    return f"no such jobs file: {jobs}"

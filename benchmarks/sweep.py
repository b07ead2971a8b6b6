"""Sweep the zoo on a GPU: expand sweep definitions into runs and measure each one in a fresh
process (`peakmem measure`'s machinery), appending rows to benchmarks/groundtruth/<gpu>.csv.

    PYTHONPATH=src python benchmarks/sweep.py benchmarks/sweeps/smoke.toml --budget-seconds 300
    PYTHONPATH=src python benchmarks/sweep.py benchmarks/sweeps/*.toml --plan   # count only

Resumable: runs already in the CSV (same job, args, allocator config, steps) are skipped, so the
same command can be repeated until everything is measured. Runs are sequential (one GPU).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from peakmem.measure.groundtruth import done_keys, profile_name, read_rows
from peakmem.measure.image_versions import collect_versions, write_versions
from peakmem.measure.sweep_plan import SweepError, SweepPlan, load_plan
from peakmem.measure.sweep_run import run_sweep, spawn_worker

REPO = Path(__file__).resolve().parents[1]
console = Console(stderr=True)


def detect_gpu() -> str:
    """The GPU's name from nvidia-smi (never touches CUDA in this process)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise click.ClickException("no nvidia-smi: give the profile name with --gpu")
    out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not names:
        raise click.ClickException("nvidia-smi found no GPU: give the profile name with --gpu")
    return names[0]


def describe(plans: list[SweepPlan], csv_path: Path) -> None:
    rows = read_rows(csv_path)
    done = done_keys(rows)
    for plan in plans:
        jobs = Counter(Path(run.job).stem for run in plan.runs)
        todo = sum(run.key not in done for run in plan.runs)
        where = csv_path if csv_path.is_file() else "the CSV"
        console.print(
            f"[bold]{plan.name}[/]: {len(plan.runs)} runs, {len(plan.configs)} configurations, "
            f"{todo} not yet in {where}; per job: "
            + ", ".join(f"{job} {n}" for job, n in sorted(jobs.items()))
        )


def record_versions(csv_path: Path) -> None:
    """Write `<csv stem>_versions.json` next to the CSV: the workers' torch, torchvision,
    transformers, timm, CUDA, cuDNN, the driver and the GPU (read in a child Python, so this
    process initialises no CUDA before the runs)."""
    try:
        versions = collect_versions(sys.executable)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        console.print(f"[yellow]versions not recorded: {exc}[/]")
        return
    path, changed = write_versions(csv_path, versions)
    console.print(f"versions -> {path}: torch {versions.get('torch')}, transformers "
                  f"{versions.get('transformers')}, cudnn {versions.get('cudnn')}, driver "
                  f"{versions.get('driver')}", highlight=False)  # fmt: skip
    if changed:
        console.print(f"[yellow]{', '.join(changed)} changed since the last sweep into {csv_path}: "
                      "its earlier rows were measured with another image[/]")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument(
    "sweeps", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option("--gpu", help="profile name (default: from nvidia-smi, e.g. h200)")
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="default: benchmarks/groundtruth/<gpu>.csv",
)
@click.option(
    "--budget-seconds",
    type=float,
    default=540,
    show_default=True,
    help="stop starting runs so that the sweep ends within this time",
)
@click.option("--retry-errors", is_flag=True, help="measure again the runs that failed")
@click.option(
    "--snapshot-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="where runs with snapshot = true dump allocator snapshots (default: <gpu>_snapshots/ "
    "next to the CSV)",
)
@click.option(
    "--preimport",
    default="torchvision,transformers",
    show_default=True,
    help="modules each worker imports before its run (hides import time)",
)
@click.option(
    "--log",
    "log_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="the jobs' output (default: the CSV path with .log)",
)
@click.option("--plan", "plan_only", is_flag=True, help="only count runs and configurations")
def main(sweeps, gpu, csv_path, budget_seconds, retry_errors, snapshot_dir, preimport, log_path,
         plan_only) -> None:  # fmt: skip
    """Measure the runs of SWEEPS (TOML sweep definitions) on this machine's GPU."""
    try:
        plans = [load_plan(path) for path in sweeps]
    except SweepError as exc:
        raise click.ClickException(str(exc)) from None
    if plan_only and gpu is None and csv_path is None:
        gpu = "plan"
    gpu = gpu or profile_name(detect_gpu())
    csv_path = csv_path or REPO / "benchmarks" / "groundtruth" / f"{gpu}.csv"
    describe(plans, csv_path)
    if plan_only:
        return
    record_versions(csv_path)
    total_runs = sum(len(p.runs) for p in plans)
    log_path = log_path or csv_path.with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    spawn = spawn_worker(sys.executable, preimport)
    snapshot_dir = snapshot_dir or csv_path.parent / f"{gpu}_snapshots"
    budget_left = budget_seconds
    with log_path.open("a") as log, Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console,
    ) as progress:  # fmt: skip
        task = progress.add_task("measuring", total=total_runs)
        for plan in plans:

            def on_run(run, status, wall, plan=plan):
                progress.advance(task)
                progress.update(task, description=f"{plan.name}: {Path(run.job).stem} {status}")
                console.print(f"{status:7s} {wall:6.1f}s  {run.job} {run.args_text}",
                              highlight=False)  # fmt: skip

            try:
                summary = run_sweep(
                    plan,
                    csv_path,
                    gpu,
                    spawn=spawn,
                    budget_seconds=budget_left,
                    log=log,
                    retry_errors=retry_errors,
                    snapshot_dir=snapshot_dir,
                    on_run=on_run,
                )
            except (RuntimeError, ValueError) as exc:
                raise click.ClickException(str(exc)) from None
            progress.advance(task, summary.skipped_done + summary.skipped_oom)
            budget_left -= summary.seconds
            console.print(
                f"[bold]{plan.name}[/]: measured {summary.measured} "
                f"({dict(sorted(summary.statuses.items()))}), already done "
                f"{summary.skipped_done}, skipped after OOM {summary.skipped_oom}, left for "
                f"later {summary.left}, {summary.seconds:.0f} s"
            )
            if summary.left:
                break
    console.print(f"rows in {csv_path}: {len(read_rows(csv_path))}")


if __name__ == "__main__":
    main()

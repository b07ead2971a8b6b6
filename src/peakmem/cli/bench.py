"""`peakmem bench DATASET`: every estimator on a measured dataset, with the papers' metrics."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from peakmem.cli.common import row_progress
from peakmem.cli.contract import BadInput, ContractCommand
from peakmem.cli.finite import FiniteFloatRange

DEFAULT_ESTIMATORS = "peakmem,horus,faketensor,gpumemnet,accelerate,deepspeed"
DEFAULT_MARGIN = 0.10


def _fail(message: str) -> None:
    """A bad flag or dataset: exit 2 the contract's way (ContractCommand reports it)."""
    raise BadInput(message)


@click.command("bench", cls=ContractCommand)
@click.argument("dataset")
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory holding gpumemnet/ and xmem/ (default: ../shared/datasets/).",
)
@click.option(
    "--estimators",
    default=DEFAULT_ESTIMATORS,
    show_default=True,
    help="Comma-separated estimator names.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Use at most N rows, evenly spread over the dataset.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON on stdout.")
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write report.md and PNG plots to DIR (the result cache goes there too).",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=os.cpu_count() or 1,
    show_default="CPU cores",
    help="Worker processes.",
)
@click.option(
    "--margin",
    type=FiniteFloatRange(min=0),
    default=DEFAULT_MARGIN,
    show_default=True,
    help="Safety margin for the 'with margin' metrics (0.1 = +10%).",
)
@click.option(
    "--cache",
    "cache_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Result cache file (default: DIR/cache.jsonl with --report, "
    "else ~/.cache/peakmem/bench-cache.jsonl).",
)
@click.option("--no-cache", is_flag=True, help="Recompute everything, store nothing.")
@click.option("--ray", "use_ray", is_flag=True,
              help="Run the estimates on Ray (a local Ray with --jobs workers; needs the "
              "service extra), as `peakmem batch` does.")
@click.option("--ray-address", default=None, metavar="ADDRESS",
              help="With --ray: the Ray cluster to run on.")
@click.option(
    "--metric",
    type=click.Choice(["memory", "utilization"]),
    default="memory",
    show_default=True,
    help="What to score: peak memory, or GPU utilization (GRACT/SMACT/SMOCC/FP32A; "
    "GPUMemNet MLP and CNN sets).",
)
def bench(
    dataset: str,
    data_dir: str | None,
    estimators: str,
    limit: int | None,
    as_json: bool,
    report_dir: str | None,
    jobs: int,
    margin: float,
    cache_path: str | None,
    no_cache: bool,
    use_ray: bool,
    ray_address: str | None,
    metric: str = "memory",
) -> None:
    """Run estimators over DATASET and report accuracy, safety and speed.

    Datasets: gpumemnet-mlp1, gpumemnet-mlp2, gpumemnet-cnn, gpumemnet-transformer,
    gpumemnet-transformer17, timm, xmem,
    groundtruth. Estimators: peakmem, horus, faketensor, gpumemnet, accelerate, deepspeed.
    """
    if use_ray or ray_address:
        try:
            import ray  # noqa: F401
        except ImportError:
            _fail("--ray needs Ray (pip install 'peakmem[service]')")
    from peakmem.baselines.base import ESTIMATORS, EstimatorUnavailable, get_estimator
    from peakmem.bench.calibration import evaluation_rows
    from peakmem.bench.metrics import summarize_estimator
    from peakmem.bench.runner import DEFAULT_CACHE, ResultCache, run_estimators
    from peakmem.datasets.loaders import (
        DATASETS,
        DatasetFormatError,
        DatasetUnavailable,
        load_rows,
        spread_subset,
    )

    if dataset not in DATASETS:
        _fail(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")
    if metric == "utilization":
        from peakmem.cli.bench_utilization import bench_utilization

        bench_utilization(dataset, data_dir, limit, as_json, report_dir, jobs, cache_path, no_cache)
        return
    names = [n.strip() for n in estimators.split(",") if n.strip()]
    unknown = [n for n in names if n not in ESTIMATORS]
    if unknown or not names:
        _fail(f"unknown estimator {', '.join(unknown) or '(none)'}; known: {', '.join(ESTIMATORS)}")
    if report_dir:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            _fail("--report needs matplotlib (pip install 'peakmem[bench]')")
    try:
        all_rows = load_rows(dataset, data_dir)
    except (DatasetUnavailable, DatasetFormatError) as exc:
        _fail(str(exc))
    if not all_rows:
        _fail(f"dataset {dataset!r} has no rows")
    if "peakmem" in names and any(row.dataset.startswith("groundtruth") for row in all_rows):
        from peakmem.baselines.peakmem_estimator import groundtruth_transformers_release

        for gpu in sorted({row.gpu for row in all_rows}):  # the rows' versions file, read once
            try:
                groundtruth_transformers_release(gpu)
            except ValueError as exc:
                _fail(str(exc))
    scored = evaluation_rows(all_rows)
    if len(scored) < len(all_rows):
        Console(stderr=True).print(
            f"{len(all_rows) - len(scored)} rows of the declared calibration split are held out "
            "(never scored)",
            highlight=False,
        )
    rows = spread_subset(scored, limit)
    instances = {}
    for name in dict.fromkeys(names):
        try:
            instances[name] = get_estimator(name)
        except EstimatorUnavailable as exc:
            _fail(str(exc))

    if no_cache:
        cache = ResultCache(None)
    elif cache_path:
        cache = ResultCache(Path(cache_path))
    elif report_dir:
        cache = ResultCache(Path(report_dir) / "cache.jsonl")
    else:
        cache = ResultCache(DEFAULT_CACHE)

    console = Console(stderr=True)
    with row_progress(f"[bold]{dataset}[/bold]", as_json) as progress:
        task = progress.add_task("estimating", total=None)
        results = run_estimators(
            instances,
            rows,
            dataset=dataset,
            cache=cache,
            jobs=jobs,
            use_ray=use_ray or ray_address is not None,
            ray_address=ray_address,
            all_rows=all_rows,
            on_total=lambda n: progress.update(task, total=n),
            on_result=lambda: progress.advance(task),
        )
    summaries = {name: summarize_estimator(rs, margin) for name, rs in results.items()}
    payload = {"dataset": dataset, "rows": len(rows), "estimators": summaries}
    if as_json:
        click.echo(json.dumps(payload, indent=2))
    else:
        out = Console()
        _print_table(out if out.is_terminal else Console(width=140), dataset, len(rows), summaries)
    if report_dir:
        from peakmem.bench.report import write_report

        capacity = Counter(r.gpu_total_bytes for r in rows).most_common(1)[0][0]
        command = "peakmem " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        path = write_report(
            Path(report_dir), dataset, command, summaries, results, margin, capacity
        )
        console.print(f"report: {path}", markup=False, highlight=False)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _print_table(console: Console, dataset: str, rows: int, summaries: dict[str, dict]) -> None:
    table = Table(title=f"{dataset}: {rows} rows")
    for col in (
        "estimator",
        "estimated",
        "median err",
        "p90 err",
        "p99 err",
        "under",
        "failure",
        "margin for 1%",
        "median s",
    ):
        table.add_column(col, justify="left" if col == "estimator" else "right")
    for name, s in summaries.items():
        seconds = s["median_seconds"]
        table.add_row(
            name,
            f"{s['estimated']}/{s['rows']}",
            _pct(s["median_rel_error"]),
            _pct(s["p90_rel_error"]),
            _pct(s["p99_rel_error"]),
            _pct(s["under_rate"]),
            _pct(s["failure_prob"]),
            _pct(s["margin_for_1pct_failures"]),
            "-" if seconds is None else f"{seconds:.3f}",
        )
    console.print(table)

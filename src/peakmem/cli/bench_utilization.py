"""`peakmem bench DATASET --metric utilization` (see peakmem.utilization.bench)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from peakmem.cli.common import row_progress
from peakmem.cli.contract import BadInput


def bench_utilization(
    dataset: str,
    data_dir: str | None,
    limit: int | None,
    as_json: bool,
    report_dir: str | None,
    jobs: int,
    cache_path: str | None,
    no_cache: bool,
) -> None:
    from peakmem.datasets.loaders import DatasetFormatError, DatasetUnavailable
    from peakmem.utilization import bench as ubench
    from peakmem.utilization.collect import DEFAULT_CACHE
    from peakmem.utilization.rows import DATASETS

    if dataset not in DATASETS:
        raise BadInput(
            f"--metric utilization needs a dataset with measured utilization: {', '.join(DATASETS)}"
        )
    if no_cache:
        cache = None
    elif cache_path:
        cache = Path(cache_path)
    elif report_dir:
        cache = Path(report_dir) / "steps.jsonl"
    else:
        cache = DEFAULT_CACHE
    console = Console(stderr=True)
    try:
        with row_progress(f"[bold]{dataset}[/bold] utilization", as_json) as progress:
            task = progress.add_task("capturing", total=None)
            summary = ubench.run(
                dataset,
                data_dir,
                limit=limit or ubench.DEFAULT_LIMIT.get(dataset),
                jobs=jobs,
                cache_path=cache,
                store=cache is not None,
                on_total=lambda n: progress.update(task, total=n),
                on_result=lambda: progress.advance(task),
            )
    except (DatasetUnavailable, DatasetFormatError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    if as_json:
        click.echo(json.dumps({k: v for k, v in summary.items() if k != "per_row"}, indent=2))
    else:
        ubench.print_table(Console() if Console().is_terminal else Console(width=140), summary)
    if report_dir:
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"utilization-{dataset}.json"
        path.write_text(json.dumps(summary, indent=1) + "\n")
        console.print(f"report: {path}", markup=False, highlight=False)

"""`peakmem bench DATASET --metric utilization`: the trace model's utilization against the
GPUMemNet measurements, beside GPUMemNet's own utilization classifier.

Rows: the dataset's rows with measured utilization, outside the declared fit split
(utilization.rows), `--limit` of them spread evenly over the set. For each metric (GRACT, SMACT,
SMOCC, FP32A): the trace model's mean absolute error, and both estimators' accuracy and macro
recall over the three bins (baselines.gpumemnet_utilization; the classifier is cross-validated
on every measured row of the dataset, the fit split included, as the paper does, and scored on
the same rows as the model).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from peakmem.datasets.rows import BenchRow
from peakmem.utilization.rows import METRICS

DEFAULT_LIMIT = {"gpumemnet-mlp1": 100, "gpumemnet-mlp2": 100, "gpumemnet-cnn": 60}


def evaluation_rows(rows: list[BenchRow], limit: int | None) -> list[BenchRow]:
    from peakmem.datasets.loaders import spread_subset
    from peakmem.utilization.rows import in_fit_split, measured

    scored = [r for r in rows if measured(r) is not None and not in_fit_split(r)]
    return spread_subset(scored, limit)


def bin_scores(labels: list[int], predicted: list[int]) -> dict[str, float | None]:
    """Accuracy, and recall averaged over the bins present in `labels` (macro recall)."""
    if not labels:
        return {"accuracy": None, "macro_recall": None}
    y, p = np.array(labels), np.array(predicted)
    recalls = [float(np.mean(p[y == k] == k)) for k in sorted(set(labels))]
    return {"accuracy": float(np.mean(y == p)), "macro_recall": float(np.mean(recalls))}


def score(
    rows: list[BenchRow],
    predictions: dict[str, dict[str, float]],
    baseline: dict[str, dict[str, int]] | None,
) -> dict[str, Any]:
    """Per metric: the model's MAE and bin scores; the baseline's bin scores."""
    from peakmem.baselines.gpumemnet_utilization import BIN_CENTERS, utilization_bin
    from peakmem.utilization.rows import measured

    out: dict[str, Any] = {}
    for metric in METRICS:
        ids = [r.id for r in rows if r.id in predictions]
        truth = {r.id: measured(r)[metric] for r in rows}  # type: ignore[index]
        errors = [abs(predictions[i][metric] - truth[i]) for i in ids]
        labels = [utilization_bin(truth[i]) for i in ids]
        model_bins = [utilization_bin(predictions[i][metric]) for i in ids]
        entry: dict[str, Any] = {
            "rows": len(ids),
            "model_mae": float(np.mean(errors)) if errors else None,
            "model_p90_abs_error": float(np.quantile(errors, 0.9)) if errors else None,
            "model": bin_scores(labels, model_bins),
            "bins_measured": [labels.count(k) for k in range(3)],
        }
        if baseline is not None:
            base_ids = [i for i in ids if i in baseline.get(metric, {})]
            base_labels = [utilization_bin(truth[i]) for i in base_ids]
            base_bins = [baseline[metric][i] for i in base_ids]
            entry["gpumemnet"] = bin_scores(base_labels, base_bins)
            entry["gpumemnet"]["rows"] = len(base_ids)
            entry["gpumemnet"]["mae_bin_center"] = (
                float(np.mean([abs(BIN_CENTERS[b] - truth[i]) for i, b in zip(base_ids, base_bins, strict=True)]))
                if base_ids
                else None
            )
        out[metric] = entry
    return out


def run_baseline(all_rows: list[BenchRow], dataset: str) -> dict[str, dict[str, int]] | None:
    """Out-of-fold bins of GPUMemNet's classifier per metric (None without scikit-learn)."""
    from peakmem.baselines.base import CannotEstimate, EstimatorUnavailable
    from peakmem.baselines.gpumemnet_utilization import cross_validate_metric
    from peakmem.utilization.rows import measured

    out = {}
    for metric in METRICS:
        targets = {}
        for row in all_rows:
            values = measured(row)
            if values is not None:
                targets[row.id] = values[metric]
        try:
            out[metric] = cross_validate_metric(all_rows, targets, dataset).predicted
        except (CannotEstimate, EstimatorUnavailable):
            return None
    return out


def run(
    dataset: str,
    data_dir: str | None,
    *,
    limit: int | None,
    jobs: int,
    cache_path: Path | None,
    store: bool = True,
    on_total: Callable[[int], None] | None = None,
    on_result: Callable[[], None] | None = None,
    with_baseline: bool = True,
) -> dict[str, Any]:
    """Capture (cached), predict and score `dataset`; the JSON-ready summary."""
    from peakmem.datasets.loaders import load_rows
    from peakmem.profiles import load_gpu
    from peakmem.utilization.collect import DEFAULT_CACHE, StepCache, collect
    from peakmem.utilization.model import StepFormatError, StepOps, fitted_params, utilization
    from peakmem.utilization.rows import DATASETS, FIT_SPLIT_DESCRIPTION, loader_of

    if dataset not in DATASETS:
        raise ValueError(
            f"--metric utilization needs a dataset with measured utilization: {', '.join(DATASETS)}"
        )
    all_rows = load_rows(dataset, data_dir)
    rows = evaluation_rows(all_rows, limit)
    records = collect(rows, StepCache((cache_path or DEFAULT_CACHE) if store else None), jobs=jobs,
                      on_total=on_total, on_result=on_result)
    params = fitted_params()
    predictions: dict[str, dict[str, float]] = {}
    failures: dict[str, int] = {}
    for row in rows:
        record = records[row.id]
        try:
            if isinstance(record, str):
                raise StepFormatError(record)
            ops = StepOps.from_meta(record)
        except StepFormatError as exc:
            reason = str(exc).split(":")[0][:80]
            failures[reason] = failures.get(reason, 0) + 1
            continue
        workers, pinned = loader_of(row)
        u = utilization(ops, load_gpu(row.gpu), params, loader_workers=workers, pinned=pinned)
        predictions[row.id] = {**{m: getattr(u, m) for m in METRICS},
                               "iteration_seconds": u.iteration_seconds}
    baseline = run_baseline(all_rows, dataset) if with_baseline else None
    return {
        "dataset": dataset,
        "metric": "utilization",
        "rows": len(rows),
        "predicted": len(predictions),
        "failures": failures,
        "fit_split": FIT_SPLIT_DESCRIPTION + " (never scored)",
        "bins": "thirds of [0, 1]: low < 1/3 <= medium < 2/3 <= high",
        "metrics": score(rows, predictions, baseline),
        "per_row": {
            row.id: {"predicted": predictions.get(row.id), "measured": _measured(row)}
            for row in rows
        },
    }


def _measured(row: BenchRow) -> dict[str, float] | None:
    from peakmem.utilization.rows import measured

    return measured(row)


def print_table(console: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    table = Table(
        title=f"{summary['dataset']}: utilization, {summary['predicted']}/{summary['rows']} rows "
        "(held-out; bins = thirds)"
    )
    for col in ("metric", "model MAE", "model acc", "model recall", "GPUMemNet acc",
                "GPUMemNet recall", "measured bins (l/m/h)"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for metric, s in summary["metrics"].items():
        base = s.get("gpumemnet") or {}
        table.add_row(
            metric.upper(),
            pct(s["model_mae"]),
            pct(s["model"]["accuracy"]),
            pct(s["model"]["macro_recall"]),
            pct(base.get("accuracy")),
            pct(base.get("macro_recall")),
            "/".join(str(n) for n in s["bins_measured"]),
        )
    console.print(table)

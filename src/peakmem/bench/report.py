"""The `--report DIR` page: a Markdown summary and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from peakmem.bench.collocation import (
    Job,
    pack_first_fit,
    pack_jobs,
    pai_like_sizes,
    simulate_estimators,
)
from peakmem.bench.metrics import RowResult
from peakmem.datasets.rows import MiB

PAI_STREAM_JOBS = 2000


def _fmt(value: object, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * float(value):.1f}%"  # type: ignore[arg-type]
    if kind == "margin":  # huge margins read better as a factor
        v = float(value)  # type: ignore[arg-type]
        return f"+{100 * v:.1f}%" if v < 10 else f"x{1 + v:,.0f}"
    if kind == "s":
        return f"{float(value):.3f}"  # type: ignore[arg-type]
    if isinstance(value, float):
        return f"{value:.0f}"
    return str(value)


def _stated(summary: dict) -> str:
    """Failure probability with the estimator's own stated margin per row ("-": states none)."""
    stated = summary.get("with_stated_margin")
    return "-" if stated is None else _fmt(stated["failure_prob"], "pct")


def summary_table(summaries: dict[str, dict], margin: float) -> str:
    head = (
        "| estimator | rows | estimated | median rel. err | p90 | p99 | median abs. err (MiB) | "
        f"under | failure prob. | failure @+{100 * margin:.0f}% | failure @stated margin | "
        "margin for <=1% failures | conserved/job (MiB) | median s |\n|" + " --- |" * 14 + "\n"
    )
    lines = []
    for name, s in summaries.items():
        lines.append(
            f"| {name} | {s['rows']} | {s['estimated']} | {_fmt(s['median_rel_error'], 'pct')} | "
            f"{_fmt(s['p90_rel_error'], 'pct')} | {_fmt(s['p99_rel_error'], 'pct')} | "
            f"{_fmt(s['median_abs_error_mib'])} | {_fmt(s['under_rate'], 'pct')} | "
            f"{_fmt(s['failure_prob'], 'pct')} | {_fmt(s['with_margin']['failure_prob'], 'pct')} | "
            f"{_stated(s)} | {_fmt(s['margin_for_1pct_failures'], 'margin')} | {_fmt(s['memory_conserved_mib'])} | "
            f"{_fmt(s['median_seconds'], 's')} |"
        )
    return head + "\n".join(lines) + "\n"


def family_table(summaries: dict[str, dict]) -> str:
    families = sorted({f for s in summaries.values() for f in s["families"]})
    names = list(summaries)
    head = "| family | " + " | ".join(names) + " |\n|" + " --- |" * (len(names) + 1) + "\n"
    lines = []
    for fam in families:
        cells = []
        for name in names:
            s = summaries[name]["families"].get(fam)
            cells.append(
                "-"
                if s is None
                else f"{_fmt(s['median_rel_error'], 'pct')} / {_fmt(s['under_rate'], 'pct')} under"
            )
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def _ok_pairs(results: list[RowResult]) -> tuple[np.ndarray, np.ndarray]:
    pairs = [
        (r.measured_bytes / MiB, r.estimate_bytes / MiB)
        for r in results
        if r.estimate_bytes is not None and r.status == "ok" and r.measured_bytes > 0
    ]
    if not pairs:
        return np.zeros(0), np.zeros(0)
    arr = np.array(pairs)
    return arr[:, 0], arr[:, 1]


def collocation_section(results: dict[str, list[RowResult]], capacity_bytes: int) -> str:
    ratios = {}
    for name, rs in results.items():
        measured, estimate = _ok_pairs(rs)
        if measured.size:
            ratios[name] = (estimate / measured).tolist()
    peaks, plan = pai_like_sizes(PAI_STREAM_JOBS, capacity_bytes, seed=0)
    packed = simulate_estimators(peaks.tolist(), ratios, capacity_bytes, seed=0)
    requests = [
        Job(int(p), int(capacity_bytes * g / 100)) for p, g in zip(peaks, plan, strict=True)
    ]
    packed["plan_gpu (user request)"] = pack_first_fit(requests, capacity_bytes)
    lines = [
        f"{PAI_STREAM_JOBS} jobs with PAI-2020-like peak sizes (distribution assumed, see "
        "peakmem/bench/collocation.py), each estimator's estimate/measured ratios on this dataset "
        f"resampled onto them, packed first-fit on {capacity_bytes / MiB:.0f} MiB GPUs; "
        "`plan_gpu` packs by the drawn user requests instead.\n",
        "| estimator | GPUs used | rejected | GPUs OOM | jobs hit by OOM | idle memory |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, p in packed.items():
        lines.append(
            f"| {name} | {p.gpus_used} | {p.rejected} | {p.oom_gpus} | {p.jobs_oom} | "
            f"{100 * p.idle_fraction:.1f}% |"
        )
    return "\n".join(lines) + "\n"


def dataset_collocation_section(
    results: dict[str, list[RowResult]], capacity_bytes: int, policy: str = "first-fit"
) -> str:
    """Pack the dataset's own jobs (rows that ran and that every estimator estimated), in order,
    with `peakmem pack`'s placement; also each estimator with the margin it states (what `pack`
    schedules on) and the user-request baseline (one whole GPU per job)."""
    usable = None
    for rs in results.values():
        ids = {r.row_id for r in rs if r.estimate_bytes is not None and r.status == "ok"}
        usable = ids if usable is None else usable & ids
    usable = usable or set()
    lines = [
        f"The dataset's own {len(usable)} jobs that ran and that every estimator estimated, in "
        f"dataset order, packed {policy} (peakmem.schedule.pack, as `peakmem pack --policy "
        f"{policy}`) on {capacity_bytes / MiB:.0f} MiB GPUs; `+ margin` packs by the estimate "
        "with the margin the estimator states; the user request is one whole GPU per job.\n",
        "| estimator | GPUs used | vs oracle | rejected | GPUs OOM | jobs hit by OOM | idle memory |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    if not usable:
        return lines[0] + "\n"
    first = next(iter(results.values()))
    oracle = [Job(r.measured_bytes, r.measured_bytes) for r in first if r.row_id in usable]
    packed = {"oracle": pack_jobs(oracle, capacity_bytes, policy)}
    for name, rs in results.items():
        rows = [r for r in rs if r.row_id in usable]
        jobs = [Job(r.measured_bytes, r.estimate_bytes) for r in rows]  # type: ignore[arg-type]
        packed[name] = pack_jobs(jobs, capacity_bytes, policy)
        if any(r.stated_margin for r in rows):
            with_margin = [
                Job(r.measured_bytes, int(r.estimate_bytes * (1 + (r.stated_margin or 0.0))))  # type: ignore[operator]
                for r in rows
            ]
            packed[f"{name} + margin"] = pack_jobs(with_margin, capacity_bytes, policy)
    packed["whole GPU per job (user request)"] = pack_jobs(
        [Job(j.real_peak_bytes, capacity_bytes) for j in oracle], capacity_bytes, policy
    )
    base = packed["oracle"].gpus_used or 1
    for name, p in packed.items():
        lines.append(
            f"| {name} | {p.gpus_used} | {p.gpus_used / base:.2f}x | {p.rejected} | {p.oom_gpus} | "
            f"{p.jobs_oom} | {100 * p.idle_fraction:.1f}% |"
        )
    return "\n".join(lines) + "\n"


def _legend(ax) -> None:  # type: ignore[no-untyped-def]
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def write_plots(results: dict[str, list[RowResult]], directory: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fig, ax = plt.subplots(figsize=(6, 6))
    lo, hi = np.inf, 0.0
    for name, rs in results.items():
        measured, estimate = _ok_pairs(rs)
        if measured.size:
            ax.scatter(measured, np.maximum(estimate, 1), s=6, alpha=0.5, label=name)
            lo = min(lo, measured.min())
            hi = max(hi, measured.max(), estimate.max())
    if hi > 0:
        ax.plot([max(lo, 1), hi], [max(lo, 1), hi], "k--", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("measured peak (MiB)")
    ax.set_ylabel("estimate (MiB)")
    ax.set_title("estimate vs measured")
    _legend(ax)
    fig.tight_layout()
    fig.savefig(directory / "scatter.png", dpi=110)
    plt.close(fig)
    files.append("scatter.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rs in results.items():
        measured, estimate = _ok_pairs(rs)
        if measured.size:
            err = np.sort(np.abs(estimate - measured) / measured)
            ax.step(err, np.arange(1, err.size + 1) / err.size, where="post", label=name)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("relative error |est - measured| / measured")
    ax.set_ylabel("share of rows")
    ax.set_title("error CDF")
    _legend(ax)
    fig.tight_layout()
    fig.savefig(directory / "error_cdf.png", dpi=110)
    plt.close(fig)
    files.append("error_cdf.png")

    families = sorted({r.family for rs in results.values() for r in rs})
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(families) + 2), 4.5))
    width = 0.8 / max(len(results), 1)
    for k, (name, rs) in enumerate(results.items()):
        medians = []
        for fam in families:
            measured, estimate = _ok_pairs([r for r in rs if r.family == fam])
            medians.append(
                float(np.median(np.abs(estimate - measured) / measured)) if measured.size else 0
            )
        ax.bar(np.arange(len(families)) + k * width, medians, width, label=name)
    ax.set_xticks(np.arange(len(families)) + 0.4 - width / 2)
    ax.set_xticklabels(families, rotation=30, ha="right", fontsize=8)
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_ylabel("median relative error")
    ax.set_title("per-family error")
    _legend(ax)
    fig.tight_layout()
    fig.savefig(directory / "family_errors.png", dpi=110)
    plt.close(fig)
    files.append("family_errors.png")
    return files


def write_report(
    directory: Path,
    dataset: str,
    command: str,
    summaries: dict[str, dict],
    results: dict[str, list[RowResult]],
    margin: float,
    capacity_bytes: int,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    plots = write_plots(results, directory)
    page = [
        f"# peakmem bench: {dataset}\n",
        f"Command: `{command}`\n",
        "## Estimators\n",
        summary_table(summaries, margin),
        "Relative and absolute errors and the underestimate rate are over rows that ran; failure "
        "probability (xMem) also counts OOM rows (accurate only when the estimate exceeds the "
        "GPU).\n",
        "## Per family (median relative error / underestimate rate)\n",
        family_table(summaries),
    ]
    if capacity_bytes > 0:
        page += [
            "## Collocation\n",
            dataset_collocation_section(results, capacity_bytes),
            dataset_collocation_section(results, capacity_bytes, "best-fit-decreasing"),
            collocation_section(results, capacity_bytes),
        ]
    page += ["## Plots\n"] + [f"![{p}]({p})\n" for p in plots]
    errors = {n: s["errors"] for n, s in summaries.items() if s["errors"]}
    if errors:
        page.append("## Rows an estimator could not estimate (most common reasons)\n")
        for name, reasons in errors.items():
            for reason, count in reasons.items():
                page.append(f"- {name}: {count} x {reason}")
        page.append("")
    path = directory / "report.md"
    path.write_text("\n".join(page))
    return path

"""Predicted vs measured utilization, one panel per metric, from the bench's JSON reports.

    peakmem bench gpumemnet-mlp1 --metric utilization --data ../shared/datasets \
        --report benchmarks/results/utilization          # (and mlp2, cnn)
    python benchmarks/plot_utilization.py benchmarks/results/utilization
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METRICS = ("gract", "smact", "smocc", "fp32a")
COLORS = {"gpumemnet-mlp1": "tab:blue", "gpumemnet-mlp2": "tab:green", "gpumemnet-cnn": "tab:red"}


def main(folder: str) -> None:
    out = Path(folder)
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.2))
    for path in sorted(out.glob("utilization-gpumemnet-*.json")):
        report = json.loads(path.read_text())
        rows = [r for r in report["per_row"].values() if r["predicted"] and r["measured"]]
        for ax, metric in zip(axes, METRICS, strict=True):
            ax.scatter([r["measured"][metric] for r in rows], [r["predicted"][metric] for r in rows],
                       s=8, alpha=0.6, color=COLORS.get(report["dataset"], "gray"),
                       label=f"{report['dataset']} (MAE {report['metrics'][metric]['model_mae']:.3f})")
    for ax, metric in zip(axes, METRICS, strict=True):
        ax.plot([0, 1], [0, 1], color="black", lw=0.8)
        for edge in (1 / 3, 2 / 3):
            ax.axvline(edge, color="gray", lw=0.4, ls=":")
            ax.axhline(edge, color="gray", lw=0.4, ls=":")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel=f"measured {metric.upper()}",
               ylabel=f"predicted {metric.upper()}", title=metric.upper())
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    target = out / "utilization_scatter.png"
    fig.savefig(target, dpi=110)
    print(target)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/utilization")

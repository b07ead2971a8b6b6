"""A memory-over-time plot of the captured trace: allocated bytes per event, the peak marked.
PNG when matplotlib is installed and the file ends in .png; otherwise a standalone HTML page."""

from __future__ import annotations

import html
from pathlib import Path

from peakmem.estimate.api import Estimate
from peakmem.estimate.breakdown import rounded
from peakmem.trace.events import ALLOC_KINDS, EventKind

MIB = 2**20


def allocated_series(result: Estimate) -> list[int]:
    trace = result.capture.trace
    live: dict[int, int] = {}
    total = 0
    series = []
    for kind, ident, size, _stream, _tag in trace.events():
        if kind in ALLOC_KINDS:
            live[ident] = rounded(size)
            total += live[ident]
        elif kind == EventKind.FREE:
            total -= live.pop(ident, 0)
        series.append(total)
    return series


def write_timeline(result: Estimate, path: str | Path) -> Path:
    """Allocated and reserved bytes per event (reserved needs the simulation's timeline)."""
    path = Path(path)
    simulated = getattr(result.simulation, "timeline", None)
    series = list(simulated.allocated) if simulated is not None else allocated_series(result)
    reserved = list(simulated.reserved) if simulated is not None else []
    peak_index = max(range(len(series)), key=series.__getitem__) if series else 0
    if path.suffix.lower() == ".png":
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ValueError("a PNG timeline needs matplotlib; use an .html file") from None
        fig, ax = plt.subplots(figsize=(10, 4))
        ax.plot([s / MIB for s in series], label="allocated")
        if reserved:
            ax.plot([s / MIB for s in reserved], label="reserved")
        ax.axhline(result.peak_reserved_bytes / MIB, color="red", linestyle="--", label="peak reserved")
        ax.axvline(peak_index, color="gray", linestyle=":", label="allocated peak")
        ax.set_xlabel("event")
        ax.set_ylabel("MiB")
        ax.legend()
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        return path
    width, height = 900, 300
    top = max(max(series, default=1), result.peak_reserved_bytes, 1)
    step = max(len(series) - 1, 1)
    def polyline(values: list[int], colour: str) -> str:
        points = " ".join(
            f"{i * width / step:.1f},{height - s * height / top:.1f}" for i, s in enumerate(values)
        )
        return f"<polyline fill='none' stroke='{colour}' points='{points}'/>"

    reserved_y = height - result.peak_reserved_bytes * height / top
    peak_x = peak_index * width / step
    title = html.escape(f"peakmem timeline: {result.gpu.name}, peak {result.peak_bytes / MIB:,.1f} MiB")
    path.write_text(
        f"<!doctype html><meta charset='utf-8'><title>{title}</title><h3>{title}</h3>"
        f"<svg width='{width}' height='{height}' style='border:1px solid #ccc'>"
        f"{polyline(series, 'steelblue')}{polyline(reserved, 'orange') if reserved else ''}"
        f"<line x1='0' x2='{width}' y1='{reserved_y:.1f}' y2='{reserved_y:.1f}' stroke='red' stroke-dasharray='4'/>"
        f"<line x1='{peak_x:.1f}' x2='{peak_x:.1f}' y1='0' y2='{height}' stroke='gray' stroke-dasharray='2'/>"
        f"</svg><p>blue: allocated bytes per trace event; orange: reserved; red: simulated peak reserved "
        f"({result.peak_reserved_bytes / MIB:,.1f} MiB); gray: allocated peak (event {peak_index}).</p>",
        encoding="utf-8",
    )
    return path

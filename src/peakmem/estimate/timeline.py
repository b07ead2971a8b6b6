"""A memory timeline people can read: time in events with the optimizer steps marked and the
phases (forward / backward / optimizer / eval) shaded, memory in GiB, live memory stacked by
category, the simulated allocated and reserved memory, the peak reserved as a red line (the
number in the title) and what is live at the peak annotated.

By the file's extension: `.html` an interactive plotly page (a static SVG page where plotly is
not installed), `.png` a matplotlib image. The numbers come from
`peakmem.estimate.timeline_data`.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from peakmem.estimate.timeline_data import GIB, TimelineData, timeline_data

PHASE_COLOURS = {"forward": "#4c9be8", "backward": "#f28e2b", "optimizer": "#59a14f",
                 "eval": "#b07aa1"}
CATEGORY_COLOURS = {
    "parameter": "#1f77b4", "buffer": "#aec7e8", "gradient": "#ff7f0e",
    "optimizer_state": "#2ca02c", "activation": "#d62728", "input": "#9467bd",
    "temporary": "#8c564b", "workspace": "#e377c2", "other": "#7f7f7f",
    "ema": "#17becf", "communication": "#bcbd22", "model_copy": "#9edae5",
}
SUFFIXES = (".html", ".htm", ".png")


def write_timeline(result: Any, path: str | Path) -> Path:
    """Write the estimate's timeline to `path` (.html or .png); ValueError for another
    extension or a PNG without matplotlib."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"a timeline is an .html or .png file, not {path.name!r}")
    data = timeline_data(result)
    if suffix == ".png":
        _png(data, path)
    else:
        try:
            import plotly  # noqa: F401
        except ImportError:
            _svg_page(data, path)
        else:
            _plotly_page(data, path)
    return path


def _gib(values: list[int]) -> list[float]:
    return [v / GIB for v in values]


def _png(data: TimelineData, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("a PNG timeline needs matplotlib (pip install matplotlib); "
                         "or write an .html file") from None
    fig, ax = plt.subplots(figsize=(13, 5))
    for start, end, phase in data.phases:
        ax.axvspan(start, end, color=PHASE_COLOURS.get(phase, "#dddddd"), alpha=0.10, lw=0)
    if data.categories:
        ax.stackplot(data.x, *[_gib(v) for v in data.categories.values()],
                     labels=list(data.categories),
                     colors=[CATEGORY_COLOURS.get(c, "#7f7f7f") for c in data.categories],
                     alpha=0.8)
    ax.plot(data.x, _gib(data.allocated), color="black", lw=1, label="allocated")
    if data.reserved:
        ax.plot(data.x, _gib(data.reserved), color="black", lw=1, ls="--", label="reserved")
    ax.axhline(data.peak_reserved / GIB, color="red", lw=1.2,
               label=f"peak reserved {data.peak_reserved / GIB:.2f} GiB")
    ax.annotate(data.peak_label(), xy=(data.peak_index, data.peak_allocated / GIB),
                xytext=(1.02, 0.45), textcoords="axes fraction", va="top", fontsize=8,
                bbox={"boxstyle": "round", "fc": "white", "alpha": 0.85},
                arrowprops={"arrowstyle": "->", "color": "gray"})
    if data.steps:
        ax.set_xticks([index for index, _ in data.steps], [label for _, label in data.steps],
                      rotation=45, fontsize=8)
        for index, _ in data.steps:
            ax.axvline(index, color="gray", lw=0.5, ls=":")
    ax.set_xlabel("time (allocator events; ticks: end of each optimizer step; shading: "
                  + ", ".join(f"{p} = {c}" for p, c in _phase_legend(data)) + ")", fontsize=8)
    ax.set_ylabel("GiB")
    ax.set_ylim(bottom=0)
    ax.set_title(data.title, fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def _phase_legend(data: TimelineData) -> list[tuple[str, str]]:
    names = {"forward": "blue", "backward": "orange", "optimizer": "green", "eval": "purple"}
    seen = [phase for phase in PHASE_COLOURS if any(p == phase for _, _, p in data.phases)]
    return [(phase, names[phase]) for phase in seen]


def _plotly_page(data: TimelineData, path: Path) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    for category, values in data.categories.items():
        fig.add_trace(go.Scatter(
            x=data.x, y=_gib(values), name=category, stackgroup="live", mode="lines",
            line={"width": 0, "color": CATEGORY_COLOURS.get(category, "#7f7f7f")},
            hovertemplate=f"{category}: %{{y:.3f}} GiB<extra></extra>"))
    fig.add_trace(go.Scatter(x=data.x, y=_gib(data.allocated), name="allocated",
                             line={"color": "black", "width": 1},
                             hovertemplate="allocated: %{y:.3f} GiB<extra></extra>"))
    if data.reserved:
        fig.add_trace(go.Scatter(x=data.x, y=_gib(data.reserved), name="reserved",
                                 line={"color": "black", "width": 1, "dash": "dash"},
                                 hovertemplate="reserved: %{y:.3f} GiB<extra></extra>"))
    for start, end, phase in data.phases:
        fig.add_vrect(x0=start, x1=end, fillcolor=PHASE_COLOURS.get(phase, "#dddddd"),
                      opacity=0.10, line_width=0, layer="below")
    for phase, colour in PHASE_COLOURS.items():
        if any(p == phase for _, _, p in data.phases):  # a legend entry per phase shown
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"phase: {phase}",
                                     marker={"color": colour, "symbol": "square", "size": 12,
                                             "opacity": 0.4}))
    fig.add_hline(y=data.peak_reserved / GIB, line_color="red",
                  annotation_text=f"peak reserved {data.peak_reserved / GIB:.2f} GiB",
                  annotation_position="top left")
    fig.add_annotation(x=data.peak_index, y=data.peak_allocated / GIB,
                       text=data.peak_label().replace("\n", "<br>"), showarrow=True,
                       arrowhead=2, ax=-120, ay=-60, align="left", bgcolor="white",
                       bordercolor="gray", font={"size": 10})
    xaxis: dict[str, Any] = {"title": "time (allocator events; ticks: end of each optimizer step)"}
    if data.steps:
        xaxis.update(tickmode="array", tickvals=[i for i, _ in data.steps],
                     ticktext=[label for _, label in data.steps])
    fig.update_layout(title={"text": html.escape(data.title), "font": {"size": 13}},
                      xaxis=xaxis, yaxis={"title": "GiB", "rangemode": "tozero"},
                      hovermode="x unified", template="plotly_white")
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)


def _svg_page(data: TimelineData, path: Path) -> None:
    """A static page (no plotly): the same lines and shading as an SVG."""
    width, height, pad = 960, 360, 40
    top = max([data.peak_reserved, *data.allocated, *data.reserved, 1]) * 1.05
    span = max(data.x[-1] if data.x else 1, 1)

    def px(x: float) -> float:
        return pad + x * (width - 2 * pad) / span

    def py(y: float) -> float:
        return height - pad - y * (height - 2 * pad) / top

    def polyline(values: list[int], style: str) -> str:
        points = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in zip(data.x, values, strict=True))
        return f"<polyline fill='none' {style} points='{points}'/>"

    parts = []
    for start, end, phase in data.phases:
        parts.append(f"<rect x='{px(start):.1f}' y='{pad}' width='{max(px(end) - px(start), 0.5):.1f}' "
                     f"height='{height - 2 * pad}' fill='{PHASE_COLOURS.get(phase, '#ddd')}' "
                     f"opacity='0.12'><title>{phase}</title></rect>")
    parts.append(polyline(data.allocated, "stroke='black'"))
    if data.reserved:
        parts.append(polyline(data.reserved, "stroke='black' stroke-dasharray='4'"))
    red = py(data.peak_reserved)
    parts.append(f"<line x1='{pad}' x2='{width - pad}' y1='{red:.1f}' y2='{red:.1f}' stroke='red'/>")
    ticks = max(1, int(top / GIB) // 8 or 1)
    for g in range(0, int(top / GIB) + 1, ticks):
        parts.append(f"<text x='2' y='{py(g * GIB):.1f}' font-size='10'>{g} GiB</text>")
    for index, label in data.steps:
        parts.append(f"<text x='{px(index):.1f}' y='{height - 20}' font-size='9'>"
                     f"{html.escape(label)}</text>")
    title = html.escape(data.title)
    legend = html.escape(data.peak_label()).replace("\n", "<br>")
    path.write_text(
        f"<!doctype html><meta charset='utf-8'><title>{title}</title><h3>{title}</h3>"
        f"<svg width='{width}' height='{height}' style='border:1px solid #ccc'>{''.join(parts)}"
        f"</svg><p>black: allocated; dashed: reserved; red: peak reserved "
        f"({data.peak_reserved / GIB:.2f} GiB); shading: "
        + ", ".join(f"{phase} ({colour})" for phase, colour in _phase_legend(data))
        + f"; x: allocator events, labels at the end of each optimizer step.</p><p>{legend}</p>",
        encoding="utf-8",
    )

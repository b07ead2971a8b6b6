"""What a memory timeline shows, computed from an estimate's trace and its simulation: live bytes
by category over time (stacked), allocated and reserved memory, the phases (forward / backward /
optimizer / eval) and optimizer steps, and what is live at the peak. Plotting is
`peakmem.estimate.timeline`'s job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from peakmem.estimate.breakdown import rounded
from peakmem.trace.events import ALLOC_KINDS, EventKind, Trace

GIB = 2**30
MAX_POINTS = 4000
"""Longer traces are thinned to this many points, each bucket keeping its highest moment."""
PHASE_MARKS = {"forward": "forward", "backward": "backward", "optimizer": "optimizer",
               "eval": "eval"}
CATEGORY_ORDER = ("parameter", "buffer", "gradient", "optimizer_state", "ema", "model_copy",
                  "communication", "activation", "input", "temporary", "workspace", "other")


@dataclass
class TimelineData:
    x: list[int]
    """Event indices of the points."""
    categories: dict[str, list[int]]
    """Live (rounded) bytes per category at each point, in stacking order."""
    allocated: list[int]
    reserved: list[int]
    phases: list[tuple[int, int, str]] = field(default_factory=list)
    """(first event, last event, phase) spans."""
    steps: list[tuple[int, str]] = field(default_factory=list)
    """(event, "step N") where each optimizer step ended."""
    peak_index: int = 0
    """The event where allocated memory is highest."""
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_reserved_index: int = 0
    peak_device: int = 0
    context_bytes: int = 0
    live_at_peak: list[tuple[str, int]] = field(default_factory=list)
    top_modules: list[tuple[str, int]] = field(default_factory=list)
    title: str = ""

    def peak_label(self) -> str:
        """What is live at the peak, a line per category (largest first)."""
        lines = [f"peak allocated {self.peak_allocated / GIB:.2f} GiB at event {self.peak_index}"]
        lines += [f"{name}: {size / GIB:.2f} GiB" for name, size in self.live_at_peak if size]
        if self.top_modules:
            name, size = self.top_modules[0]
            lines.append(f"largest module: {name} ({size / GIB:.2f} GiB)")
        return "\n".join(lines)


def _live_by_category(trace: Trace) -> tuple[dict[str, list[int]], list[int]]:
    live: dict[int, tuple[str, int]] = {}
    totals: dict[str, int] = {}
    series: dict[str, list[int]] = {}
    allocated: list[int] = []
    total = 0
    for index, (kind, ident, size, _stream, tag_id) in enumerate(trace.events()):
        if kind in ALLOC_KINDS:
            tag = trace.tags[tag_id] if tag_id >= 0 else None
            category = (tag.category if tag is not None and tag.category else "other")
            live[ident] = (category, rounded(size))
            totals[category] = totals.get(category, 0) + rounded(size)
            if category not in series:
                series[category] = [0] * index
            total += rounded(size)
        elif kind == EventKind.FREE and ident in live:
            category, size = live.pop(ident)
            totals[category] -= size
            total -= size
        for category, values in series.items():
            values.append(totals.get(category, 0))
        allocated.append(total)
    return series, allocated


def _phases(trace: Trace) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]]]:
    spans: list[tuple[int, int, str]] = []
    steps: list[tuple[int, str]] = []
    current: tuple[int, str] | None = None
    for index, kind in enumerate(trace.kinds):
        if kind != EventKind.MARK:
            continue
        tag = trace.tag_of(index)
        label = (tag.op if tag is not None else None) or ""
        if label.startswith("step "):
            steps.append((index, label))
            continue
        phase = PHASE_MARKS.get(label)
        if phase is None:
            continue
        if current is not None:
            spans.append((current[0], index, current[1]))
        current = (index, phase)
    if current is not None:
        spans.append((current[0], max(len(trace) - 1, current[0]), current[1]))
    return spans, steps


def _thin(length: int, weight: list[int], keep: set[int]) -> list[int]:
    """Indices to plot: all of them up to MAX_POINTS, else the highest point of each bucket
    (plus `keep`)."""
    if length <= MAX_POINTS:
        return list(range(length))
    bucket = -(-length // MAX_POINTS)
    chosen = set(keep)
    for start in range(0, length, bucket):
        end = min(start + bucket, length)
        chosen.add(max(range(start, end), key=weight.__getitem__))
        chosen.add(start)
    chosen.add(length - 1)
    return sorted(i for i in chosen if 0 <= i < length)


def timeline_data(result: Any) -> TimelineData:
    """The timeline of an Estimate (`result.capture.trace`, `result.simulation.timeline` when the
    estimate was made with `timeline=True`)."""
    trace: Trace = result.capture.trace
    series, allocated_live = _live_by_category(trace)
    simulated = getattr(result.simulation, "timeline", None)
    n = len(trace)
    if simulated is not None and len(simulated.allocated) == n:
        allocated, reserved = list(simulated.allocated), list(simulated.reserved)
    else:
        allocated, reserved = allocated_live, []
    peak_index = max(range(n), key=allocated.__getitem__) if n else 0
    reserved_index = max(range(len(reserved)), key=reserved.__getitem__) if reserved else 0
    points = _thin(n, allocated, {peak_index, reserved_index})
    ordered = sorted(series, key=lambda c: (CATEGORY_ORDER.index(c) if c in CATEGORY_ORDER
                                            else len(CATEGORY_ORDER), c))
    breakdown = result.breakdown
    phases, steps = _phases(trace)
    data = TimelineData(
        x=points,
        categories={c: [series[c][i] for i in points] for c in ordered},
        allocated=[allocated[i] for i in points],
        reserved=[reserved[i] for i in points] if reserved else [],
        phases=phases,
        steps=steps,
        peak_index=peak_index,
        peak_allocated=allocated[peak_index] if n else 0,
        peak_reserved=int(result.peak_reserved_bytes),
        peak_reserved_index=reserved_index,
        peak_device=int(result.peak_bytes),
        context_bytes=int(result.context_bytes + result.library_bytes),
        live_at_peak=sorted(breakdown.by_category.items(), key=lambda item: -item[1]),
        top_modules=breakdown.top_modules(3),
    )
    data.title = (
        f"peakmem: {result.gpu.name}, peak reserved {data.peak_reserved / GIB:.2f} GiB "
        f"(device peak {data.peak_device / GIB:.2f} GiB with CUDA context and libraries), "
        f"{result.steps} training step(s)"
    )
    return data

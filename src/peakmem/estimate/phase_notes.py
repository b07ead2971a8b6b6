"""What the trace's marks say about the peak: whether the evaluation after training set it, and
how much of it a torch.compile'd run might not hold (the capture runs compiled code eagerly)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

from peakmem.allocator.caching import K_SMALL_BUFFER
from peakmem.trace.events import ALLOC_KINDS, EventKind, Trace
from peakmem.trace.vocab import Mark

EVAL_MARK = Mark.EVAL.value
REGION_START = Mark.COMPILED.value
REGION_END = Mark.COMPILED_END.value
_TRAINING_MARKS = ("forward", "backward", "optimizer")
_MIB = 2**20


def _marks(trace: Trace) -> list[tuple[int, str]]:
    found = []
    for index, kind in enumerate(trace.kinds):
        if kind == EventKind.MARK:
            tag = trace.tag_of(index)
            found.append((index, (tag.op if tag is not None else None) or ""))
    return found


EVAL_PEAK = "the peak was set by the evaluation after training"
TRAIN_PEAK = "the peak was set during training, not by the evaluation after it"


def _phase_at(marks: list[tuple[int, str]], at: int) -> tuple[str | None, int]:
    """The phase the event at `at` is in ("eval", "training" or None) and, for "eval", the
    index of the mark that started that evaluation."""
    phase, eval_start = None, -1
    for index, label in marks:
        if index > at:
            break
        if label == EVAL_MARK:
            phase, eval_start = "eval", index
        elif label in _TRAINING_MARKS or label.startswith("step "):
            phase = "training"
    return phase, eval_start


def eval_peak_note(trace: Trace, peak_index: int,
                   reserved: Callable[[], Sequence[int]] | None = None,
                   allocated_peak_index: int | None = None) -> str | None:
    """Whether an evaluation after training (an "eval" mark) set the peak: the event at
    `peak_index` (where reserved memory first reached its maximum) came after an "eval" mark and
    before the next training mark. None when no evaluation ran after training.

    `reserved` (called only then): reserved bytes after each event. When the evaluation raised
    reserved memory above everything before its mark by no more than one segment of the small
    pool (K_SMALL_BUFFER, 2 MiB: an allocation under 1 MiB found no free small block) and the
    allocated peak (`allocated_peak_index`) is not in an evaluation either, training set the
    peak and the note says so (round 22b: minDiffusion's sampling loop after batch-1024
    training steps got one 2 MiB small segment)."""
    marks = _marks(trace)
    if not any(label == EVAL_MARK for _, label in marks):
        return None
    phase, eval_start = _phase_at(marks, peak_index)
    if phase != "eval":
        return TRAIN_PEAK
    if reserved is not None and allocated_peak_index is not None and eval_start > 0:
        line = reserved()
        before = max(line[:eval_start], default=0)
        added = line[peak_index] - before if peak_index < len(line) else -1
        if (before > 0 and 0 <= added <= K_SMALL_BUFFER
                and _phase_at(marks, allocated_peak_index)[0] != "eval"):
            return (f"the peak was set during training: the evaluation after it added only "
                    f"{added / _MIB:.1f} MiB of reserved memory (a segment of the small-block "
                    "pool)")
    return EVAL_PEAK


@cache
def _pointwise(op: str) -> bool:
    """Whether the aten op named like "relu.default" is elementwise (torch.Tag.pointwise)."""
    import torch

    base, _, overload = op.partition(".")
    try:
        packet = getattr(torch.ops.aten, base)
        overload_op = getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return False
    return torch.Tag.pointwise in overload_op.tags


def compiled_pointwise_bytes(trace: Trace, peak_index: int) -> int | None:
    """Bytes live at `peak_index` that elementwise ops made inside torch.compile'd regions
    (None: no compiled region ran). Inductor fuses such ops into their consumers or recomputes
    them in backward instead of saving them, so the compiled run may not hold them."""
    if not any(label == REGION_START for _, label in _marks(trace)):
        return None
    depth = 0
    live: dict[int, int] = {}  # id -> size, of allocations made in a region by a pointwise op
    for index in range(min(peak_index, len(trace) - 1) + 1):
        kind = trace.kinds[index]
        if kind == EventKind.MARK:
            tag = trace.tag_of(index)
            label = tag.op if tag is not None else None
            if label == REGION_START:
                depth += 1
            elif label == REGION_END and depth:
                depth -= 1
        elif kind in ALLOC_KINDS:
            tag = trace.tag_of(index)
            if depth and tag is not None and tag.op and _pointwise(tag.op):
                live[trace.ids[index]] = trace.sizes[index]
        elif kind == EventKind.FREE:
            live.pop(trace.ids[index], None)
    return sum(live.values())


def compile_bound_note(trace: Trace, peak_index: int, peak_allocated: int) -> str | None:
    fused = compiled_pointwise_bytes(trace, peak_index)
    if fused is None:
        return None
    if not fused:
        return (
            "torch.compile: no output of an elementwise op made in a compiled region is live at "
            "the peak; the compiled run's peak is likely close to this one"
        )
    return (
        f"torch.compile: {fused / _MIB:.1f} MiB live at the peak are outputs of elementwise ops "
        "in compiled regions, which Inductor may fuse away or recompute; the compiled run's "
        f"peak allocated memory is likely between {(peak_allocated - fused) / _MIB:.1f} and "
        f"{peak_allocated / _MIB:.1f} MiB"
    )

"""A safety reserve in bytes, added to the fractional safety margin for kinds of jobs whose
underestimates scale with one allocation size rather than with the peak.

Attention jobs (GPUMemNet's Transformer rows, issue 13): the rows still under after every rule
are under by a whole number of segments of the largest gradient (the embedding's, V x E fp32): a
short-lived allocation of that size the trace does not have, or the real allocator opening one
more segment of it than the simulation does, shows as one extra segment of that size. The
stated margin of those jobs is therefore `peak x (1 + fraction) + ATTENTION_RESERVE_SEGMENTS x
segment(largest gradient)`, the segment sized as the caching allocator sizes it (round_size,
then the allocation size of its pool). The fraction and the segment count are fitted on the
declared Transformer calibration split (bench/calibration.py; docs/BENCHMARKS.md).
What those misses are (docs/BENCHMARKS.md "The A100 tail"): allocator-layout edges, which
estimate/layout_probe.py finds per job, and amounts the A100 held besides the job in GPUMemNet's
step-1 campaign, which no per-job figure covers; hence the blanket segments.

Per job, on top of that (issue 13, xMem's runs): an attention job whose replay sits at an
allocator-layout edge (estimate/layout_probe.py: one small persistent block, or a cuBLAS
workspace of another size, moves its reserved peak by a whole segment of a large size) states
that move too: `LAYOUT_PROBE_KINDS`. Its reserve is the larger of the segments above and the
largest upward move of a probe that flips the layout, rounded up to a whole `LAYOUT_RESERVE_QUANTUM` (two 2 MiB-rounded
segments are always a whole 4 MiB; the layout figure keeps that form). The GPU run differs from
the capture by such small blocks (library workspaces, handles), so which side of the edge it
lands on is not known from the CPU; the reserve covers the side above. A job the probes do not
move keeps the segment reserve alone.
"""

from __future__ import annotations

from peakmem.allocator.caching import CachingAllocator
from peakmem.allocator.config import AllocatorConfig
from peakmem.allocator.rules import AllocatorRules
from peakmem.estimate.layout_probe import probe_layout
from peakmem.trace.events import ALLOC_KINDS, NO_TAG, Trace
from peakmem.trace.vocab import Category

ATTENTION_RESERVE_SEGMENTS = 2
"""Segments of the largest gradient's size reserved for attention jobs."""

# margin kind (estimate/margin_kinds.py) -> segments of the largest gradient's size reserved;
# a kind not listed reserves nothing
RESERVE_SEGMENTS: dict[str, int] = {"attention": ATTENTION_RESERVE_SEGMENTS}

LAYOUT_PROBE_KINDS: frozenset[str] = frozenset({"attention"})
"""Margin kinds whose reserve also covers the layout probe's upward excess (a replay of the
trace per probe, estimate/layout_probe.py; the large-pool probes replay the large pool's events
alone)."""

LAYOUT_RESERVE_QUANTUM = 4 * 2**20
"""The layout reserve is rounded up to whole multiples of this (bytes)."""


def largest_gradient_bytes(trace: Trace) -> int:
    """The largest requested size among the trace's gradient allocations (0 without any)."""
    gradient_tags = {
        index for index, tag in enumerate(trace.tags) if tag.category == Category.GRADIENT.value
    }
    if not gradient_tags:
        return 0
    largest = 0
    for kind, size, tag in zip(trace.kinds, trace.sizes, trace.tag_ids, strict=True):
        if tag != NO_TAG and tag in gradient_tags and kind in ALLOC_KINDS and size > largest:
            largest = size
    return largest


def segment_bytes(size: int, alloc_conf: str | None = None, torch_version: str | None = None) -> int:
    """The segment the caching allocator would cudaMalloc for a request of `size` bytes:
    `get_allocation_size(round_size(size))` under the job's allocator settings."""
    if size <= 0:
        return 0
    allocator = CachingAllocator(
        AllocatorConfig.parse(alloc_conf or None, torch_version),
        AllocatorRules.for_version(torch_version),
    )
    return allocator.get_allocation_size(allocator.round_size(size))


def margin_reserve_bytes(
    kind: str, trace: Trace | None, alloc_conf: str | None = None, torch_version: str | None = None
) -> int:
    """The reserve a job of margin kind `kind` states on top of its fractional margin."""
    if trace is None:
        return 0
    segments = RESERVE_SEGMENTS.get(kind, 0)
    reserve = 0
    if segments:
        reserve = segments * segment_bytes(largest_gradient_bytes(trace), alloc_conf, torch_version)
    if kind in LAYOUT_PROBE_KINDS:
        reserve = max(reserve, layout_reserve_bytes(trace, alloc_conf, torch_version))
    return reserve


def layout_reserve_bytes(
    trace: Trace, alloc_conf: str | None = None, torch_version: str | None = None
) -> int:
    """How much more a run that differs from the trace by one small block may reserve: the
    largest move of the reserved peak among the layout probes that move it beyond what the
    perturbation itself takes (0 where none does), rounded up to a whole
    `LAYOUT_RESERVE_QUANTUM`."""
    if not trace.kinds:
        return 0
    probe = probe_layout(trace, alloc_conf, torch_version)
    move = max([0, *(probe.moves[name] for name in probe.moves if probe.excess_bytes(name) > 0)])
    return -(-move // LAYOUT_RESERVE_QUANTUM) * LAYOUT_RESERVE_QUANTUM

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
"""

from __future__ import annotations

from peakmem.allocator.caching import CachingAllocator
from peakmem.allocator.config import AllocatorConfig
from peakmem.allocator.rules import AllocatorRules
from peakmem.trace.events import ALLOC_KINDS, NO_TAG, Trace
from peakmem.trace.vocab import Category

ATTENTION_RESERVE_SEGMENTS = 2
"""Segments of the largest gradient's size reserved for attention jobs."""

# margin kind (estimate/margin_kinds.py) -> segments of the largest gradient's size reserved;
# a kind not listed reserves nothing
RESERVE_SEGMENTS: dict[str, int] = {"attention": ATTENTION_RESERVE_SEGMENTS}


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
    segments = RESERVE_SEGMENTS.get(kind, 0)
    if segments == 0 or trace is None:
        return 0
    return segments * segment_bytes(largest_gradient_bytes(trace), alloc_conf, torch_version)

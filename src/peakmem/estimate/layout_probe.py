"""How far a simulated peak sits from an allocator-layout flip.

The caching allocator serves a request from the smallest cached block that fits (best fit,
`get_free_block`) and splits it. A job whose largest tensor (an embedding's gradient, Adam's
`_foreach_sqrt` temporary of it) is freed and allocated again every step leaves a cached block
of that size free while the forward and backward run; as long as every other request finds a
smaller cached block, the block stays whole and is reused. When one request does not (the
20 MiB segments of the requests below 10 MiB happen to be full at that moment), best fit splits
the large free block and the next request of the large size opens a new segment: the reserved
peak grows by one whole segment of the largest size, from a change of a few MiB.

Which side of that edge a real run falls on depends on every small allocation in it; a capture
that differs from the GPU run by one small persistent block (a library workspace of another
size, a cuBLAS handle of another thread) can land on the other side. `probe_layout` measures
that: it replays the trace again with one extra persistent block of each probe size allocated
before the first event (the smallest perturbation of the 20 MiB-segment pool there is) and
reports how the reserved peak moves beyond the bytes the block itself takes.

Found on GPUMemNet's Transformer rows (issue 13): the rows the A100 measured about one
embedding-gradient segment over the estimate (00481, 00831, 00754, 00288) move by that segment
under a probe of 2-8 MiB, while rows measured to the MiB (00240, 00573) do not move at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from peakmem.allocator.simulate import simulate
from peakmem.trace.events import ALLOC_KINDS, Trace

MiB = 1 << 20

PROBE_SIZES: tuple[int, ...] = (2 * MiB, 4 * MiB, 6 * MiB, 8 * MiB)
"""Extra persistent blocks tried: all above kSmallSize (1 MiB) and below kMinLargeAlloc (10 MiB),
so each one lands in the pool of 20 MiB segments that the large pool's requests below 10 MiB
share (a 1 MiB request would go to the small pool's 2 MiB segments instead)."""


@dataclass(frozen=True)
class LayoutProbe:
    """The reserved peak of a trace, and of the same trace with each probe block added."""

    base_reserved_bytes: int
    probed_reserved_bytes: dict[int, int]
    """probe size -> peak reserved bytes with that block allocated before the first event."""
    probe_segment_bytes: dict[int, int]
    """probe size -> what the block itself can add to the reserve (one 20 MiB segment: a block
    below 10 MiB either fits a cached segment or opens one of kLargeBuffer)."""

    def excess_bytes(self, size: int) -> int:
        """How much more the peak grows under probe `size` than the block's own segment."""
        return self.probed_reserved_bytes[size] - self.base_reserved_bytes - (
            self.probe_segment_bytes[size]
        )

    @property
    def max_excess_bytes(self) -> int:
        """The largest growth beyond the probe's own segment (0 when no probe grows it more)."""
        return max([0, *(self.excess_bytes(size) for size in self.probed_reserved_bytes)])

    @property
    def min_excess_bytes(self) -> int:
        """The largest drop of the peak under a probe (<= 0; 0 when none lowers it): the
        simulation sat one layout above a run that differs by a small block."""
        return min([0, *(self.probed_reserved_bytes[size] - self.base_reserved_bytes
                         for size in self.probed_reserved_bytes)])

    @property
    def flips(self) -> bool:
        """Whether some probe moves the peak by more than its own segment either way."""
        return self.max_excess_bytes > 0 or self.min_excess_bytes < 0


def with_persistent_block(trace: Trace, size: int) -> Trace:
    """A copy of `trace` with one block of `size` bytes allocated before its first event and
    never freed (tags, streams and ids of the other events unchanged)."""
    probed = Trace(meta=dict(trace.meta))
    for tag in trace.tags:  # the same tag ids as in `trace`
        probed.intern(tag)
    used = [ident for ident, kind in zip(trace.ids, trace.kinds, strict=True)
            if kind in ALLOC_KINDS]
    probed.alloc(size, ident=max(used, default=-1) + 1, op="layout_probe")
    probed.kinds.extend(trace.kinds)
    probed.ids.extend(trace.ids)
    probed.sizes.extend(trace.sizes)
    probed.streams.extend(trace.streams)
    probed.tag_ids.extend(trace.tag_ids)
    return probed


def probe_layout(
    trace: Trace,
    alloc_conf: str | None = None,
    torch_version: str | None = None,
    sizes: Iterable[int] = PROBE_SIZES,
) -> LayoutProbe:
    """Replay `trace` as is and with one extra persistent block of each of `sizes` bytes; see
    the module docstring. Each replay is one `simulate` of the whole trace."""
    base = simulate(trace, alloc_conf, torch_version).peak_reserved_bytes
    probed: dict[int, int] = {}
    own: dict[int, int] = {}
    for size in sizes:
        if size <= 0:
            raise ValueError(f"probe sizes must be positive, got {size}")
        probed[size] = simulate(
            with_persistent_block(trace, size), alloc_conf, torch_version
        ).peak_reserved_bytes
        alone = Trace()
        alone.alloc(size)
        own[size] = simulate(alone, alloc_conf, torch_version).peak_reserved_bytes
    return LayoutProbe(base, probed, own)

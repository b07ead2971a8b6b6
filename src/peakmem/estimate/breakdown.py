"""What is live at the peak: bytes by category and by module, from the trace."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from peakmem.trace.events import ALLOC_KINDS, EventKind, Trace

BLOCK_ROUND = 512  # the caching allocator's minimum block and rounding (FACTS.md section 1)


def rounded(size: int) -> int:
    return BLOCK_ROUND if size < BLOCK_ROUND else -(-size // BLOCK_ROUND) * BLOCK_ROUND


@dataclass(frozen=True)
class PeakBreakdown:
    by_category: dict[str, int]
    by_module: dict[str, int]
    live_bytes: int

    @classmethod
    def at(cls, trace: Trace, index: int) -> PeakBreakdown:
        """Live allocations just after event `index` (rounded as the allocator rounds them)."""
        live: dict[int, int] = {}
        kinds, ids = trace.kinds, trace.ids
        for i in range(min(index, len(trace) - 1) + 1):
            kind = kinds[i]
            if kind in ALLOC_KINDS:
                live[ids[i]] = i
            elif kind == EventKind.FREE:
                live.pop(ids[i], None)
        categories: Counter[str] = Counter()
        modules: Counter[str] = Counter()
        for event_index in live.values():
            size = rounded(trace.sizes[event_index])
            tag = trace.tag_of(event_index)
            categories[(tag.category if tag and tag.category else "other")] += size
            if tag and tag.module:
                modules[tag.module] += size
        return cls(dict(categories), dict(modules), sum(categories.values()))

    def top_modules(self, count: int = 5) -> list[tuple[str, int]]:
        return sorted(self.by_module.items(), key=lambda item: -item[1])[:count]

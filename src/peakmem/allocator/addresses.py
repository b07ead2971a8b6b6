"""Where new segments land in the device's address space.

Addresses matter to the caching allocator only where two free blocks have the same size: best fit
then takes the lower address. The driver's choice is not documented; by default the simulation
hands out the lowest free range that fits (freed ranges are reused), else fresh addresses above
everything so far. When replaying a real snapshot, the addresses the driver really returned can
be given as hints: a new segment of a size recorded there takes the next recorded address of that
size, if that range is free in the simulation.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import Iterable

SEGMENT_ALIGNMENT = 2 * 1024 * 1024  # the driver hands out device memory in 2 MiB pages
DEFAULT_BASE = 0x7F0000000000
FALLBACK_BASE = 1 << 60  # far above any recorded address: fallbacks never collide with hints


class DeviceAddressSpace:
    """cudaMalloc/cudaFree of address ranges (no memory accounting: the allocator does that)."""

    def __init__(self, hints: Iterable[tuple[int, int]] | None = None) -> None:
        self._hints: dict[int, deque[int]] = defaultdict(deque)
        for size, addr in hints or ():
            self._hints[size].append(addr)
        self._next = FALLBACK_BASE if self._hints else DEFAULT_BASE
        self._free_ranges: list[tuple[int, int]] = []  # released ranges below _next, sorted
        self._live_starts: list[int] = []  # sorted starts of live ranges
        self._live: dict[int, int] = {}  # start -> size

    def malloc(self, size: int) -> int:
        addr = self._from_hint(size)
        if addr is None:
            addr = self._from_free_ranges(size)
        if addr is None:
            addr = self._next
            self._next += -(-size // SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT
        self._live[addr] = size
        bisect.insort(self._live_starts, addr)
        return addr

    def free(self, addr: int) -> None:
        size = self._live.pop(addr)
        del self._live_starts[bisect.bisect_left(self._live_starts, addr)]
        if self._hints:
            return  # with hints, recorded addresses are reused through the hints only
        ranges = self._free_ranges
        bisect.insort(ranges, (addr, size))
        merged: list[tuple[int, int]] = []
        for start, length in ranges:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self._free_ranges = merged

    def _from_hint(self, size: int) -> int | None:
        queue = self._hints.get(size)
        while queue:
            addr = queue.popleft()
            if not self._overlaps(addr, size):
                return addr
        return None

    def _from_free_ranges(self, size: int) -> int | None:
        for i, (start, length) in enumerate(self._free_ranges):
            if length >= size:
                if length == size:
                    del self._free_ranges[i]
                else:
                    self._free_ranges[i] = (start + size, length - size)
                return start
        return None

    def _overlaps(self, addr: int, size: int) -> bool:
        i = bisect.bisect_right(self._live_starts, addr)
        if i > 0:
            prev = self._live_starts[i - 1]
            if prev + self._live[prev] > addr:
                return True
        return i < len(self._live_starts) and self._live_starts[i] < addr + size

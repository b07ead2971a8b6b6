"""The private memory pools of one capture: CUDA graphs' pools and `torch.cuda.MemPool`s, as
the trace's POOL_BEGIN / POOL_END / POOL_RELEASE events (allocator/private_pools.py replays
them by CUDACachingAllocator's rules).

A pool handle is torch's `MempoolId_t` pair: `(0, n)` for a user-created one
(`graph_pool_handle()`, `MemPool()`), `(n, 0)` for the one a graph makes itself when given none;
`n` counts from 1 for both, and the trace calls the pool `n`. A handle the job made up itself
gets the next free number. Misuse the C++ asserts on (beginning a pool twice, releasing one not
in use, reusing a released pool before its memory was freed) raises RuntimeError in the job,
before anything is recorded, so the trace stays one the allocator can replay."""

from __future__ import annotations

from typing import Any

from peakmem.capture.session import CaptureSession


class GraphPools:
    """Handles -> trace pool ids, use counts as the job's calls made them, the pools underway."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session
        self.ids: dict[tuple[int, int], int] = {}
        self.use_counts: dict[int, int] = {}
        self.underway: list[int] = []
        self._next = 1

    # -- handles ------------------------------------------------------------------------------
    def new_handle(self, *, user_created: bool) -> tuple[int, int]:
        number = self._take_number()
        handle = (0, number) if user_created else (number, 0)
        self.ids[handle] = number
        return handle

    def _take_number(self) -> int:
        number = self._next
        self._next += 1
        return number

    def pool_id(self, handle: Any) -> int:
        key = as_pool_handle(handle)
        ident = self.ids.get(key)
        if ident is None:
            ident = self.ids[key] = self._take_number()
        return ident

    # -- the allocator calls --------------------------------------------------------------------
    def begin(self, handle: Any) -> None:
        """`beginAllocateToPool`: create the pool or raise its use count; route to it."""
        ident = self.pool_id(handle)
        with self.session._lock:
            if ident in self.underway:
                raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
            self._incref(ident)
            self.underway.append(ident)
            self._record("pool_begin", ident)

    def end(self, handle: Any) -> None:
        """`endAllocateToPool`."""
        ident = self.pool_id(handle)
        with self.session._lock:
            if ident in self.underway:
                self.underway.remove(ident)
                self._record("pool_end", ident)

    def create(self, handle: Any) -> None:
        """`createOrIncrefPool` (a MemPool made): a begin and end with nothing between."""
        self.begin(handle)
        self.end(handle)

    def release(self, handle: Any) -> None:
        """`releasePool`: the use count drops; at zero its free segments may be cudaFreed."""
        ident = self.pool_id(handle)
        with self.session._lock:
            count = self.use_counts.get(ident, 0)
            if count <= 0:
                raise RuntimeError(f"releasePool: mempool {as_pool_handle(handle)} is not in use")
            self.use_counts[ident] = count - 1
            self._record("pool_release", ident)

    def empty(self, handle: Any) -> None:
        """`emptyCache(mempool_id)`: free that pool's wholly free segments if it is released."""
        ident = self.pool_id(handle)
        with self.session._lock:
            if not self.session.closed:
                self.session.trace.empty_cache(ident)

    def use_count(self, handle: Any) -> int:
        return self.use_counts.get(self.pool_id(handle), 0)

    def capturing(self) -> bool:
        return bool(self.underway)

    # -- helpers --------------------------------------------------------------------------------
    def _incref(self, ident: int) -> None:
        count = self.use_counts.get(ident)
        if count == 0 and self._still_allocated(ident):
            raise RuntimeError(
                "the memory pool was released (its graphs reset) but its memory was not freed "
                "yet: it cannot be shared again (CUDACachingAllocator asserts use_count > 0)"
            )
        self.use_counts[ident] = (count or 0) + 1

    def _still_allocated(self, ident: int) -> bool:
        """The allocator still holds released pool `ident` (segments not yet cudaFreed)."""
        memory = self.session.memory
        if memory is None:
            return False
        memory.sync()
        return ident in memory.allocator.graph_pools

    def _record(self, what: str, ident: int) -> None:
        if not self.session.closed:
            getattr(self.session.trace, what)(ident)


def as_pool_handle(handle: Any) -> tuple[int, int]:
    """A MempoolId_t from what the job passed: a pair of ints (or a MemPool's `id`)."""
    pair = getattr(handle, "id", handle)
    try:
        first, second = (int(value) for value in pair)
    except (TypeError, ValueError):
        raise TypeError(f"a memory pool handle is a pair of ints, got {handle!r}") from None
    return first, second

"""Private memory pools of the caching allocator: CUDA graphs' pools and `torch.cuda.MemPool`
(c10/cuda/CUDACachingAllocator.cpp: `PrivatePool`, `graph_pools`, `captures_underway`,
`graph_pools_freeable`, `beginAllocateToPool`, `endAllocateToPool`, `releasePool`).

The rules, as the C++ has them:
- `beginAllocateToPool(id)` creates the pool or raises its use count (`create_or_incref_pool`)
  and puts it in `captures_underway`; while it is there, `get_pool` serves every allocation (the
  filter: the capturing stream, or the thread under `use_mem_pool`; a capture runs one thread
  and its streams, so every allocation of the capture) from the pool's own small and large
  `BlockPool`s, and new segments are cudaMalloc'd for it (`cudaMalloc_count`).
- A block keeps its pool for life: freed during or after the capture it goes back to that pool
  (`free_block` inserts into `*block->pool`), where only later allocations to the same pool can
  take it. Nothing of a private pool is ever handed to the default pools, nor the other way.
- While a capture is underway, `malloc` neither processes cross-stream events nor frees the
  cache to retry (`captures_underway.empty()` guards both), and `empty_cache` leaves the
  default pools alone.
- `endAllocateToPool(id)` stops the routing; the pool and its blocks stay.
- `releasePool(id)` drops the use count (a graph's `reset()` or destructor, `use_mem_pool`'s
  exit, a MemPool's destructor); at zero the pool becomes freeable: `release_cached_blocks`
  (empty_cache, or an out-of-memory retry) then cudaFrees its wholly free segments, and erases
  the pool once it has none left. Until then the pool's segments stay reserved, allocated or
  not.
- `emptyCache(id)` (a MemPool's destructor) does that for one freeable pool only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from peakmem.trace.events import ALL_POOLS, EventKind

if TYPE_CHECKING:
    from peakmem.allocator.caching import Pool

K_SMALL_SIZE = 1024 * 1024


class PrivatePool:
    """A `PrivatePool`: a use count, the segments it cudaMalloc'd, its own block pools."""

    __slots__ = ("ident", "use_count", "malloc_count", "small_blocks", "large_blocks")

    def __init__(self, ident: int, small_blocks: Pool, large_blocks: Pool) -> None:
        self.ident = ident
        self.use_count = 1
        self.malloc_count = 0
        self.small_blocks = small_blocks
        self.large_blocks = large_blocks


class PrivatePoolError(ValueError):
    """A pool event the C++ would reject (an assertion): releasing a pool not in use,
    beginning a pool twice, ending one that was not begun."""


class PrivatePoolsMixin:
    """The private-pool half of `CachingAllocator` (kept apart from the default-pool code)."""

    graph_pools: dict[int, PrivatePool]
    captures_underway: list[int]
    graph_pools_freeable: dict[int, PrivatePool]

    def _new_block_pool(self, is_small: bool, owner: PrivatePool | None) -> Pool:
        raise NotImplementedError

    def release_blocks(self, pool: Pool) -> None:
        raise NotImplementedError

    # -- the C++ entry points ---------------------------------------------------------------------
    def create_or_incref_pool(self, pool_id: int) -> PrivatePool:
        private = self.graph_pools.get(pool_id)
        if private is None:
            private = PrivatePool(pool_id, None, None)  # type: ignore[arg-type]
            private.small_blocks = self._new_block_pool(True, private)
            private.large_blocks = self._new_block_pool(False, private)
            self.graph_pools[pool_id] = private
        else:
            if private.use_count <= 0:  # TORCH_INTERNAL_ASSERT(it->second->use_count > 0)
                raise PrivatePoolError(f"pool {pool_id} was released: it cannot be used again")
            private.use_count += 1
        return private

    def begin_allocate_to_pool(self, pool_id: int) -> None:
        if pool_id in self.captures_underway:
            raise PrivatePoolError(f"beginAllocateToPool: already recording to pool {pool_id}")
        self.create_or_incref_pool(pool_id)
        self.captures_underway.append(pool_id)

    def end_allocate_to_pool(self, pool_id: int) -> None:
        if pool_id not in self.captures_underway:
            raise PrivatePoolError(f"endAllocateToPool: pool {pool_id} is not being recorded to")
        self.captures_underway.remove(pool_id)

    def release_pool(self, pool_id: int) -> None:
        private = self.graph_pools.get(pool_id)
        if private is None or private.use_count <= 0:
            raise PrivatePoolError(f"releasePool: pool {pool_id} is not in use")
        private.use_count -= 1
        if private.use_count == 0:
            self.graph_pools_freeable[pool_id] = private

    # -- what malloc and release_cached_blocks call -----------------------------------------------
    def capture_pool(self, size: int) -> Pool:
        """`get_pool` while a capture is underway: the first pool begun (every allocation of the
        capture passes its filter)."""
        private = self.graph_pools[self.captures_underway[0]]
        return private.small_blocks if size <= K_SMALL_SIZE else private.large_blocks

    def release_freeable_pools(self, pool_id: int = ALL_POOLS) -> None:
        """The private-pool loop of `release_cached_blocks`: cudaFree the wholly free segments
        of every freeable pool (or of pool `pool_id` only, if it is freeable) and forget a pool
        with no segment left."""
        for ident, private in list(self.graph_pools_freeable.items()):
            if pool_id != ALL_POOLS and ident != pool_id:
                continue
            self.release_blocks(private.small_blocks)
            self.release_blocks(private.large_blocks)
            if private.malloc_count == 0 and not _has_expandable(self, private):
                del self.graph_pools[ident]
                del self.graph_pools_freeable[ident]


def _has_expandable(allocator: Any, private: PrivatePool) -> bool:
    return any(
        segment.pool is private.small_blocks or segment.pool is private.large_blocks
        for segment in allocator.expandable_segments
    )


def apply_pool_event(allocator: PrivatePoolsMixin, kind: int, pool_id: int) -> None:
    """Replay a POOL_BEGIN / POOL_END / POOL_RELEASE event (trace.events)."""
    if kind == EventKind.POOL_BEGIN:
        allocator.begin_allocate_to_pool(pool_id)
    elif kind == EventKind.POOL_END:
        allocator.end_allocate_to_pool(pool_id)
    elif kind == EventKind.POOL_RELEASE:
        allocator.release_pool(pool_id)
    else:  # pragma: no cover - the callers dispatch on POOL_KINDS
        raise ValueError(f"not a pool event: {kind}")

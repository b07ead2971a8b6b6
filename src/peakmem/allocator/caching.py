"""A simulation of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`,
`DeviceCachingAllocator`), one device.

Methods are named after the C++ functions they mirror (`round_size`, `get_pool`,
`get_allocation_size`, `get_free_block`, `should_split`, `free_block`, `try_merge_blocks`,
`release_available_cached_blocks`, `release_cached_blocks`, `garbage_collect_cached_blocks`,
expandable segments' `try_allocate_expandable_block`, `map_block`, `unmap_block`) so the Python
can be read next to the C++. On the replay's hot path `alloc_found_block` is written out inside
`malloc`, and `free_block` inside `free` as well (a call per event less; comments mark them).

Free blocks live in per-pool sorted lists of `(stream, size, addr)` keys: the C++ `BlockPool`
set ordered by `BlockComparatorSize` (stream, then size, then address). A key is those three
fields packed into one int (`free_key`, `key_fields`) in the same order: bisecting ints costs
about half of bisecting tuples. Unmapped blocks of expandable segments live in `(stream, addr)`
lists (`BlockComparatorAddress`).
"""

from __future__ import annotations

import copy
from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Any

from peakmem.allocator.addresses import DeviceAddressSpace
from peakmem.allocator.config import K_LARGE_BUFFER, AllocatorConfig
from peakmem.allocator.free_lists import FreeList
from peakmem.allocator.private_pools import PrivatePool, PrivatePoolsMixin
from peakmem.allocator.rules import AllocatorRules
from peakmem.trace.events import ALL_POOLS

MB = 1024 * 1024
K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = MB  # largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 * MB  # "small" allocations are packed in 2 MiB blocks
K_MIN_LARGE_ALLOC = 10 * MB  # allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2 * MB  # round up large allocations to 2 MiB

FIELD_BITS = 96
"""Width of the size and address fields of a free-list key: sizes are < 2**63 and addresses
< 2**61 plus the sizes handed out, far below 2**96."""
FIELD_MASK = (1 << FIELD_BITS) - 1


def free_key(stream: int, size: int, addr: int) -> int:
    """A free block's key in its pool's sorted list: `(stream, size, addr)` as one int that
    orders as the tuple does (any int stream; 0 <= size, addr < 2**FIELD_BITS)."""
    return (((stream << FIELD_BITS) + size) << FIELD_BITS) + addr


def key_fields(key: int) -> tuple[int, int, int]:
    """`(stream, size, addr)` of a free-list key (free_key's inverse)."""
    return key >> (2 * FIELD_BITS), (key >> FIELD_BITS) & FIELD_MASK, key & FIELD_MASK


class OutOfMemory(Exception):
    """The simulated device cannot satisfy a request even after releasing every cached block."""

    def __init__(self, size: int, reserved: int, allocated: int, limit: int | None) -> None:
        self.size = size
        self.reserved = reserved
        self.allocated = allocated
        self.limit = limit
        super().__init__(
            f"out of memory: tried to allocate {size} bytes with {reserved} reserved "
            f"({allocated} allocated) of a {limit if limit is not None else 'unbounded'}-byte limit"
        )


class Block:
    """A `Block`: a contiguous range of a segment, allocated or free (or unmapped)."""

    __slots__ = (
        "addr",
        "size",
        "stream",
        "pool",
        "prev",
        "next",
        "allocated",
        "requested",
        "mapped",
        "segment",
        "stream_uses",
        "event_count",
        "gc_count_base",
    )

    def __init__(
        self, addr: int, size: int, stream: int, pool: Pool, segment: ExpandableSegment | None = None
    ) -> None:
        self.addr = addr
        self.size = size
        self.stream = stream
        self.pool = pool
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.requested = 0
        self.mapped = True
        self.segment = segment
        self.stream_uses: set[int] | None = None
        self.event_count = 0
        self.gc_count_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __deepcopy__(self, memo: dict[int, Any]) -> Block:
        """Copy the whole chain this block is in (its segment's blocks, linked by `prev` /
        `next`) at once, the links set from the copies: `copy.deepcopy` following the links one
        block at a time nests a few frames per block, and a segment split into ~150 blocks
        passed Python's recursion limit (the layout probe forks whole allocators)."""
        head = self
        while head.prev is not None:
            head = head.prev
        copies: list[tuple[Block, Block]] = []
        block: Block | None = head
        while block is not None:
            if id(block) not in memo:
                twin = Block.__new__(Block)
                memo[id(block)] = twin
                copies.append((block, twin))
            block = block.next
        for original, twin in copies:
            for name in Block.__slots__:
                value = getattr(original, name)
                if name in ("prev", "next"):
                    setattr(twin, name, None if value is None else memo[id(value)])
                else:
                    setattr(twin, name, copy.deepcopy(value, memo))
        return memo[id(self)]

    def key(self) -> int:
        """This block's key in its pool's free list (free_key)."""
        return free_key(self.stream, self.size, self.addr)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        state = "alloc" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block({state} {self.size}@{self.addr:#x} s{self.stream})"


_new_block = Block.__new__


class Pool:
    """A `BlockPool`: the free blocks of the small or the large pool, all streams together.
    `owner`: the private pool it belongs to (`owner_PrivatePool`), None for the default pools."""

    __slots__ = ("is_small", "blocks", "unmapped", "get_free_blocks_call_count", "owner")

    def __init__(self, is_small: bool, owner: PrivatePool | None = None) -> None:
        self.is_small = is_small
        self.owner = owner
        self.blocks = FreeList()  # free_key(stream, size, addr)
        self.unmapped = FreeList()  # (stream, addr)
        self.get_free_blocks_call_count = 0


class ExpandableSegment:
    """A reserved range of virtual addresses, backed by physical pages of `page_size` bytes
    mapped and unmapped on demand (`ExpandableSegment` in the C++)."""

    __slots__ = ("base", "page_size", "num_pages", "mapped_pages", "stream", "pool")

    def __init__(
        self, base: int, address_space: int, page_size: int, stream: int, pool: Pool
    ) -> None:
        self.base = base
        self.page_size = page_size
        self.num_pages = -(-address_space // page_size)
        self.mapped_pages: set[int] = set()
        self.stream = stream
        self.pool = pool

    @property
    def size(self) -> int:
        return self.num_pages * self.page_size

    @property
    def mapped_bytes(self) -> int:
        return len(self.mapped_pages) * self.page_size


@dataclass(frozen=True)
class DeviceLimits:
    """How much device memory the allocator may reserve.

    `capacity_bytes`: what cudaMalloc can hand out to this process before failing (the GPU's
    memory less the CUDA context and anything else outside the allocator); None = unbounded.
    `memory_fraction` with `total_bytes`: `torch.cuda.set_per_process_memory_fraction`, which caps
    reserved memory at `fraction * total_bytes` and enables garbage collection.
    """

    capacity_bytes: int | None = None
    memory_fraction: float | None = None
    total_bytes: int | None = None

    @property
    def allowed_memory_maximum(self) -> int | None:
        if self.memory_fraction is None:
            return None
        total = self.total_bytes if self.total_bytes is not None else self.capacity_bytes
        if total is None:
            raise ValueError("a memory fraction needs the device's total memory (total_bytes)")
        return int(self.memory_fraction * total)

    @property
    def address_space_total(self) -> int:
        """`prop.totalGlobalMem` for sizing expandable segments' address space."""
        for value in (self.total_bytes, self.capacity_bytes):
            if value:  # a capacity of 0 maps nothing, but the segment still needs a range
                return value
        return 1 << 40


class CachingAllocator(PrivatePoolsMixin):
    """One device's caching allocator. `malloc` returns a Block or raises OutOfMemory.
    Private pools (CUDA graphs, MemPool): allocator.private_pools."""

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        rules: AllocatorRules | None = None,
        limits: DeviceLimits | None = None,
        address_space: DeviceAddressSpace | None = None,
    ) -> None:
        self.config = config or AllocatorConfig()
        self.rules = rules or AllocatorRules.for_version(None)
        self.limits = limits or DeviceLimits()
        self.small_blocks = Pool(is_small=True)
        self.large_blocks = Pool(is_small=False)
        self.blocks_by_addr: dict[int, Block] = {}  # every free (mapped) block in a pool
        self._unmapped_blocks: dict[int, Block] = {}  # unmapped parts of expandable segments
        self.pending_free: list[Block] = []  # freed, waiting on other streams' events
        self.ready_free: list[Block] = []  # their events completed: freed at process_events
        self.expandable_segments: list[ExpandableSegment] = []
        self.segments: dict[int, int] = {}  # cudaMalloc'd segments: addr -> size
        self.addresses = address_space or DeviceAddressSpace()
        self.graph_pools: dict[int, PrivatePool] = {}
        self.captures_underway: list[int] = []
        self.graph_pools_freeable: dict[int, PrivatePool] = {}

        # statistics (the C++ `DeviceStats` aggregate values we need)
        self.total_allocated_memory = 0  # reserved bytes
        self.allocated_bytes = 0
        self.requested_bytes = 0
        self.num_alloc_retries = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

        self._set_fraction = self.limits.memory_fraction is not None
        self._allowed_memory_maximum = self.limits.allowed_memory_maximum
        self._capacity = self.limits.capacity_bytes
        self._gc_enabled = self._set_fraction and self.config.garbage_collection_threshold > 0.0
        self._expandable = self.config.expandable_segments
        self._large_segment_size = self.config.large_segment_size
        self._max_split_size = self.config.max_split_size
        self._mapped_expandable = 0  # expandable segments with at least one mapped page
        self._rounded: dict[int, int] = {}  # round_size memo (the config never changes)
        self._max_non_split_rounding = self.max_non_split_rounding

    def set_memory_fraction(self, fraction: float, total_bytes: int) -> None:
        """`setMemoryFraction`: from now on reserved memory is capped at `fraction *
        total_bytes` (and garbage collection may run, as with the limit given at start)."""
        self.limits = DeviceLimits(self.limits.capacity_bytes, fraction, total_bytes)
        self._set_fraction = True
        self._allowed_memory_maximum = self.limits.allowed_memory_maximum
        self._gc_enabled = self.config.garbage_collection_threshold > 0.0

    def set_capacity(self, capacity_bytes: int | None) -> None:
        """What cudaMalloc can hand out from now on (memory outside the allocator grew)."""
        self.limits = DeviceLimits(capacity_bytes, self.limits.memory_fraction, self.limits.total_bytes)
        self._capacity = capacity_bytes

    # -- sizes and pools ------------------------------------------------------------------------
    def round_size(self, size: int) -> int:
        rounded = self._rounded.get(size)
        if rounded is None:
            rounded = self._rounded[size] = self._round_size(size)
        return rounded

    def _round_size(self, size: int) -> int:
        if size < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        divisions = self.config.roundup_divisions_for(size)
        if divisions == 1 and self.rules.divisions_one_leaves_size_unrounded:
            return size if size > K_MIN_BLOCK_SIZE else K_MIN_BLOCK_SIZE * ((size + 511) // 512)
        if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
            return roundup_power2_next_division(size, divisions)
        return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)

    def get_pool(self, size: int) -> Pool:
        return self.small_blocks if size <= K_SMALL_SIZE else self.large_blocks

    def get_allocation_size(self, size: int) -> int:
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return self._large_segment_size
        return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)

    @property
    def max_non_split_rounding(self) -> int:
        if self.rules.max_non_split_rounding_configurable:
            return self.config.max_non_split_rounding_size
        return K_LARGE_BUFFER

    # -- malloc ---------------------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int = 0) -> Block:
        size = self._rounded.get(orig_size)
        if size is None:
            size = self.round_size(orig_size)
        capturing = self.captures_underway
        if capturing:  # a private pool's (no event processing while a capture is underway)
            pool = self.capture_pool(size)
        else:
            if self.ready_free:
                self.process_events()
            pool = self.small_blocks if size <= K_SMALL_SIZE else self.large_blocks

        block = self.get_free_block(pool, size, stream)
        if block is None:
            alloc_size = self.get_allocation_size(size)
            if self._gc_enabled:
                self.garbage_collect_cached_blocks()
            block = self.alloc_block(pool, size, alloc_size, stream)
            if block is None and self.release_available_cached_blocks(pool, size, stream):
                block = self.alloc_block(pool, size, alloc_size, stream)
            if block is None and not capturing:
                self.release_cached_blocks()
                self.num_alloc_retries += 1
                block = self.alloc_block(pool, size, alloc_size, stream)
            if block is None:
                raise OutOfMemory(
                    orig_size, self.total_allocated_memory, self.allocated_bytes, self._limit()
                )
        # should_split and alloc_found_block, inline (the replay's hottest path)
        remaining_size = block.size - size
        if block.pool.is_small or self._expandable:
            split = remaining_size >= K_MIN_BLOCK_SIZE
        else:
            split = size < self._max_split_size and remaining_size > K_SMALL_SIZE
        if split:
            remaining = block
            pool = remaining.pool
            # Block(remaining.addr, size, remaining.stream, pool, remaining.segment) linked
            # before `remaining`, its fields set here: the class call with __init__ costs
            # about twice as much
            block = _new_block(Block)
            block.addr = remaining.addr
            block.size = size
            block.stream = remaining.stream
            block.pool = pool
            prev = remaining.prev
            block.prev = prev
            if prev is not None:
                prev.next = block
            block.next = remaining
            block.allocated = False
            block.requested = 0
            block.mapped = True
            block.segment = remaining.segment
            block.stream_uses = None
            block.event_count = 0
            block.gc_count_base = 0
            remaining.prev = block
            remaining.addr += size
            remaining.size = remaining_size
            remaining.gc_count_base = pool.get_free_blocks_call_count  # _insert_free(remaining)
            key = (((remaining.stream << FIELD_BITS) + remaining_size) << FIELD_BITS) + remaining.addr
            blocks = pool.blocks
            maxes = blocks._maxes
            if len(maxes) == 1 and not blocks._index:  # FreeList.add, one sublist
                sublist = blocks._lists[0]
                insort(sublist, key)
                maxes[0] = sublist[-1]
                blocks._len += 1
                if len(sublist) > blocks._load << 1:
                    blocks._expand(0)
            else:
                blocks.add(key)
            self.blocks_by_addr[remaining.addr] = remaining
        block.allocated = True
        block.requested = orig_size
        self.allocated_bytes += block.size
        self.requested_bytes += orig_size
        return block

    def _limit(self) -> int | None:
        limits = [v for v in (self._capacity, self._allowed_memory_maximum) if v is not None]
        return min(limits) if limits else None

    def get_free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        if self._gc_enabled:
            pool.get_free_blocks_call_count += 1
        blocks = pool.blocks
        # SortedList's own layout (sorted sublists and their maxima), read directly: the common
        # lookup without its positional-index bookkeeping
        maxes = blocks._maxes
        probe = ((stream << FIELD_BITS) + size) << FIELD_BITS  # free_key(stream, size, 0)
        pos = bisect_left(maxes, probe)
        if pos == len(maxes):
            return None
        sublist = blocks._lists[pos]
        idx = bisect_left(sublist, probe)
        key = sublist[idx]
        if key >> (2 * FIELD_BITS) != stream:
            return None
        block = self.blocks_by_addr[key & FIELD_MASK]
        if block.segment is None:
            max_split = self._max_split_size
            if size < max_split and block.size >= max_split:
                return None  # do not return an oversized block for a small request
            if size >= max_split and block.size >= size + self._max_non_split_rounding:
                return None  # do not return an oversized block for a large request
            if len(maxes) == 1 and not blocks._index:  # FreeList.delete_at, one sublist
                del sublist[idx]
                blocks._len -= 1
                if sublist:
                    maxes[0] = sublist[-1]
                else:
                    del blocks._lists[0]
                    del maxes[0]
            else:
                blocks.delete_at(pos, idx)
            del self.blocks_by_addr[block.addr]
            return block
        # Expandable segments: prefer a block whose size *including the unmapped space right
        # after it* is smaller (the C++ `expandable_size` loop). The next keys are read by
        # (sublist, index) in the free list: no positional index to build and keep up.
        lists = blocks._lists
        while block.segment is not None:
            next_pos, next_idx = pos, idx + 1
            if next_idx == len(lists[pos]):
                next_pos, next_idx = pos + 1, 0
                if next_pos == len(lists):
                    break
            next_key = lists[next_pos][next_idx]
            if next_key >> (2 * FIELD_BITS) != stream:
                break
            candidate = self.blocks_by_addr[next_key & FIELD_MASK]
            if _expandable_size(candidate) >= _expandable_size(block):
                break
            block, pos, idx = candidate, next_pos, next_idx
        max_split = self._max_split_size
        if size < max_split and block.size >= max_split:
            return None  # do not return an oversized block for a small request
        if size >= max_split and block.size >= size + self._max_non_split_rounding:
            return None  # do not return an oversized block for a large request
        blocks.delete_at(pos, idx)
        del self.blocks_by_addr[block.addr]
        return block

    def should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self._expandable:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self._max_split_size and remaining > K_SMALL_SIZE

    # -- device memory ----------------------------------------------------------------------------
    def alloc_block(self, pool: Pool, size: int, alloc_size: int, stream: int) -> Block | None:
        """`alloc_block`: a new segment from the device (or more pages of an expandable one)."""
        maximum = self._allowed_memory_maximum
        if maximum is not None and self.total_allocated_memory + alloc_size > maximum:
            return None
        if self._expandable and (
            pool.owner is None or self.rules.private_pools_use_expandable_segments
        ):
            block = self.try_allocate_expandable_block(pool, size, stream)
            if block is not None:
                self._erase_free(block)
            return block
        if self._capacity is not None and self.total_allocated_memory + alloc_size > self._capacity:
            return None
        addr = self.addresses.malloc(alloc_size)
        self.total_allocated_memory += alloc_size
        self.segments[addr] = alloc_size
        self.num_device_alloc += 1
        if pool.owner is not None:
            pool.owner.malloc_count += 1
        return Block(addr, alloc_size, stream, pool)

    def release_block(self, block: Block) -> None:
        """`release_block`: cudaFree a whole cached segment."""
        self._erase_free(block)
        del self.segments[block.addr]
        self.total_allocated_memory -= block.size
        self.num_device_free += 1
        self.addresses.free(block.addr)
        if block.pool.owner is not None:
            block.pool.owner.malloc_count -= 1

    def release_available_cached_blocks(self, pool: Pool, size: int, stream: int) -> bool:
        """With max_split_size set: free oversize cached blocks (largest first) to make room."""
        max_split = self.config.max_split_size
        if not self.config.max_split_size_set:
            return False
        key_size = max(size, max_split)
        blocks = pool.blocks
        index = blocks.bisect_left(free_key(stream, key_size, 0))
        found = None
        if index < len(blocks) and key_fields(blocks[index])[0] == stream:
            found = self.blocks_by_addr[key_fields(blocks[index])[2]]
            if found.segment is not None:
                found = None
        if found is None:
            if index == 0:
                return False
            total_released = 0
            index -= 1
            while total_released < key_size:
                block = self.blocks_by_addr[blocks[index] & FIELD_MASK]
                if block.size < max_split or block.stream != stream:
                    break
                is_first = index == 0
                if not is_first:
                    index -= 1
                if block.segment is None and not block.is_split():
                    self.release_block(block)
                    total_released += block.size
                if is_first:
                    break
            return total_released >= key_size
        if found.is_split():
            return False
        self.release_block(found)
        return True

    def release_cached_blocks(self, pool_id: int = ALL_POOLS) -> None:
        """`release_cached_blocks`: complete deferred frees, then free every unsplit segment
        (not the default pools' while a capture is underway, nor with a `pool_id`), and those
        of the private pools that were released (private_pools)."""
        if pool_id == ALL_POOLS and not self.captures_underway:
            self.synchronize_and_free_events()
            self.release_blocks(self.large_blocks)
            self.release_blocks(self.small_blocks)
        if self.graph_pools_freeable:
            self.release_freeable_pools(pool_id)

    def release_blocks(self, pool: Pool) -> None:
        to_unmap = []
        for key in list(pool.blocks):
            block = self.blocks_by_addr.get(key & FIELD_MASK)
            if block is None:
                continue
            if block.segment is not None:
                to_unmap.append(block)
            elif block.prev is None and block.next is None:
                self.release_block(block)
        for block in to_unmap:
            self.unmap_block(block)
            if block.prev is None and block.next is None:
                self.release_expandable_segment(block)

    def release_expandable_segment(self, block: Block) -> None:
        """A wholly unmapped expandable segment gives its address range back."""
        segment = block.segment
        assert segment is not None and not block.mapped and block.size == segment.size
        block.pool.unmapped.remove((block.stream, block.addr))
        del self._unmapped_blocks[block.addr]
        self.expandable_segments.remove(segment)
        self.addresses.free(segment.base)

    def garbage_collect_cached_blocks(self) -> None:
        """`garbage_collect_cached_blocks`: free cached large blocks older than the average age
        until reserved memory is back under threshold * allowed maximum."""
        maximum = self._allowed_memory_maximum
        assert maximum is not None
        gc_threshold = int(self.config.garbage_collection_threshold * maximum)
        if self.total_allocated_memory <= gc_threshold:
            return
        target_size = self.total_allocated_memory - gc_threshold
        gc_reclaimed = 0
        pool = self.large_blocks
        calls = pool.get_free_blocks_call_count
        total_age = 0
        freeable = 0
        for key in pool.blocks:
            block = self.blocks_by_addr[key & FIELD_MASK]
            if not block.is_split() and block.segment is None:
                total_age += calls - block.gc_count_base
                freeable += 1
        if freeable == 0:
            return
        block_freed = True
        while gc_reclaimed < target_size and block_freed and freeable > 0:
            age_threshold = total_age / freeable
            block_freed = False
            for key in list(pool.blocks):
                block = self.blocks_by_addr[key & FIELD_MASK]
                age = calls - block.gc_count_base
                if not block.is_split() and block.segment is None and age >= age_threshold:
                    block_freed = True
                    gc_reclaimed += block.size
                    total_age -= age
                    freeable -= 1
                    self.release_block(block)

    # -- free -------------------------------------------------------------------------------------
    def free(self, block: Block) -> None:
        """`free`: hand a block back, or defer it until its other-stream uses complete."""
        block.allocated = False
        # Both drop at free request time, deferred or not. (PyTorch's own `requested_bytes` stat
        # waits for free_block; ours counts what the program still holds, so that
        # allocated >= requested always.)
        self.allocated_bytes -= block.size
        self.requested_bytes -= block.requested
        if block.stream_uses:
            block.event_count = len(block.stream_uses)
            block.stream_uses = None
            self.pending_free.append(block)
            return
        block.requested = 0  # free_block(block), inline
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            self.try_merge_blocks(block, prev)
        if nxt is not None and not nxt.allocated:
            self.try_merge_blocks(block, nxt)
        pool = block.pool
        block.gc_count_base = pool.get_free_blocks_call_count
        key = (((block.stream << FIELD_BITS) + block.size) << FIELD_BITS) + block.addr
        blocks = pool.blocks
        maxes = blocks._maxes
        if len(maxes) == 1 and not blocks._index:  # FreeList.add, one sublist
            sublist = blocks._lists[0]
            insort(sublist, key)
            maxes[0] = sublist[-1]
            blocks._len += 1
            if len(sublist) > blocks._load << 1:
                blocks._expand(0)
        else:
            blocks.add(key)
        self.blocks_by_addr[block.addr] = block

    def record_stream(self, block: Block, stream: int) -> None:
        if stream == block.stream:
            return
        if block.stream_uses is None:
            block.stream_uses = set()
        block.stream_uses.add(stream)

    def complete_free(self, block: Block) -> None:
        """The events of a deferred free have completed: the block is freed at process_events."""
        if block in self.pending_free:
            self.pending_free.remove(block)
            self.ready_free.append(block)

    def process_events(self) -> None:
        ready, self.ready_free = self.ready_free, []
        for block in ready:
            block.event_count = 0
            self.free_block(block)

    def synchronize_and_free_events(self) -> None:
        pending = self.ready_free + self.pending_free
        self.ready_free = []
        self.pending_free = []
        for block in pending:
            block.event_count = 0
            self.free_block(block)

    def free_block(self, block: Block) -> None:
        block.requested = 0
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            self.try_merge_blocks(block, prev)
        if nxt is not None and not nxt.allocated:
            self.try_merge_blocks(block, nxt)
        pool = block.pool  # _insert_free, inline
        block.gc_count_base = pool.get_free_blocks_call_count
        pool.blocks.add((((block.stream << FIELD_BITS) + block.size) << FIELD_BITS) + block.addr)
        self.blocks_by_addr[block.addr] = block

    def try_merge_blocks(self, dst: Block, src: Block | None) -> int:
        if (
            src is None
            or src.allocated
            or src.event_count > 0
            or src.stream_uses
            or dst.mapped != src.mapped
        ):
            return 0
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        subsumed = src.size
        dst.size += subsumed
        if src.mapped:  # _erase_free, inline
            key = (((src.stream << FIELD_BITS) + subsumed) << FIELD_BITS) + src.addr
            blocks = src.pool.blocks
            maxes = blocks._maxes
            if len(maxes) == 1 and not blocks._index:  # FreeList.remove, one sublist
                sublist = blocks._lists[0]
                idx = bisect_left(sublist, key)
                if idx == len(sublist) or sublist[idx] != key:
                    raise ValueError(f"{key!r} not in list")
                del sublist[idx]
                blocks._len -= 1
                if sublist:
                    maxes[0] = sublist[-1]
                else:
                    del blocks._lists[0]
                    del maxes[0]
            else:
                blocks.remove(key)
            del self.blocks_by_addr[src.addr]
        else:
            src.pool.unmapped.remove((src.stream, src.addr))
            del self._unmapped_blocks[src.addr]
        return subsumed

    def empty_cache(self, pool_id: int = ALL_POOLS) -> None:
        self.release_cached_blocks(pool_id)

    def _new_block_pool(self, is_small: bool, owner: PrivatePool | None) -> Pool:
        return Pool(is_small, owner)

    # -- free-block bookkeeping -----------------------------------------------------------------
    def _insert_free(self, block: Block) -> None:
        pool = block.pool
        block.gc_count_base = pool.get_free_blocks_call_count
        pool.blocks.add(free_key(block.stream, block.size, block.addr))
        self.blocks_by_addr[block.addr] = block

    def _erase_free(self, block: Block) -> None:
        block.pool.blocks.remove(free_key(block.stream, block.size, block.addr))
        del self.blocks_by_addr[block.addr]

    # -- expandable segments ------------------------------------------------------------------
    def _segment_page_size(self, pool: Pool) -> int:
        return K_SMALL_BUFFER if pool.is_small else self._large_segment_size

    def find_expandable_block(self, pool: Pool, size: int, stream: int) -> Block:
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated and b.event_count == 0 and not b.stream_uses

        def has_available_address_space(b: Block | None) -> bool:
            total = 0
            while total < size and allocatable(b):
                assert b is not None
                total += b.size
                b = b.next
            return total >= size

        unmapped = pool.unmapped
        index = unmapped.bisect_left((stream, -1))
        while index < len(unmapped) and unmapped[index][0] == stream:
            c = self._unmapped_blocks[unmapped[index][1]]
            if allocatable(c.prev):
                c = c.prev  # a free mapped block right before the unmapped space
            if has_available_address_space(c):
                return c
            index += 1
        page = self._segment_page_size(pool)
        address_space = self.limits.address_space_total + self.limits.address_space_total // 8
        segment = ExpandableSegment(0, address_space, page, stream, pool)
        segment.base = self.addresses.malloc(segment.size)  # reserve the virtual address range
        self.expandable_segments.append(segment)
        candidate = Block(segment.base, segment.size, stream, pool)
        candidate.mapped = False
        candidate.segment = segment
        self._unmapped_blocks[candidate.addr] = candidate
        pool.unmapped.add((stream, candidate.addr))
        return candidate

    def try_allocate_expandable_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        candidate = self.find_expandable_block(pool, size, stream)
        if not candidate.mapped:
            mapped = self.map_block(candidate, min(candidate.size, size))
            if mapped is None:
                return None
            candidate = mapped
        while candidate.size < size:
            remaining = size - candidate.size
            nxt = candidate.next
            if nxt is None:
                # The request is larger than the segment's whole address space (the device's
                # total memory + 1/8): no GPU could map it, so it is out of memory.
                return None
            assert not nxt.mapped
            mapped = self.map_block(nxt, min(remaining, nxt.size))
            if mapped is None:
                return None
            candidate = mapped
        return candidate

    def map_block(self, to_map: Block, size: int) -> Block | None:
        """Map pages for the first `size` bytes of the unmapped block `to_map`; returns the
        (merged) free block that holds them, or None when the device has no room."""
        segment = to_map.segment
        assert segment is not None and not to_map.mapped
        page = segment.page_size
        offset = to_map.addr - segment.base
        begin = offset // page
        end = -(-(offset + size) // page)
        mapped_size = (end - begin) * page
        if (
            self._capacity is not None
            and self.total_allocated_memory + mapped_size > self._capacity
        ):
            return None
        if not segment.mapped_pages:
            self._mapped_expandable += 1
        segment.mapped_pages.update(range(begin, end))
        pool = to_map.pool
        pool.unmapped.remove((to_map.stream, to_map.addr))
        del self._unmapped_blocks[to_map.addr]
        to_map.mapped = True
        if mapped_size < to_map.size:
            remaining = Block(
                to_map.addr + mapped_size, to_map.size - mapped_size, to_map.stream, pool
            )
            remaining.mapped = False
            remaining.segment = segment
            _link_after(to_map, remaining)
            pool.unmapped.add((remaining.stream, remaining.addr))
            self._unmapped_blocks[remaining.addr] = remaining
            to_map.size = mapped_size
        self.try_merge_blocks(to_map, to_map.prev)
        self.try_merge_blocks(to_map, to_map.next)
        self._insert_free(to_map)
        self.total_allocated_memory += mapped_size
        self.num_device_alloc += 1
        return to_map

    def unmap_block(self, block: Block) -> None:
        """Unmap the whole pages inside the free block `block` (release_cached_blocks)."""
        segment = block.segment
        assert segment is not None
        page = segment.page_size
        offset = block.addr - segment.base
        begin = -(-offset // page)
        end = (offset + block.size) // page
        if begin >= end:
            return
        unmapped_addr = segment.base + begin * page
        unmapped_size = (end - begin) * page
        pool = block.pool
        self._erase_free(block)
        before_size = unmapped_addr - block.addr
        if before_size > 0:
            before = Block(block.addr, before_size, block.stream, pool)
            before.segment = segment
            _link_before(before, block)
            self._insert_free(before)
        after_size = block.size - (before_size + unmapped_size)
        if after_size > 0:
            after = Block(unmapped_addr + unmapped_size, after_size, block.stream, pool)
            after.segment = segment
            _link_after(block, after)
            self._insert_free(after)
        block.addr = unmapped_addr
        block.size = unmapped_size
        block.mapped = False
        segment.mapped_pages.difference_update(range(begin, end))
        if not segment.mapped_pages:
            self._mapped_expandable -= 1
        self.try_merge_blocks(block, block.prev)
        self.try_merge_blocks(block, block.next)
        pool.unmapped.add((block.stream, block.addr))
        self._unmapped_blocks[block.addr] = block
        self.total_allocated_memory -= unmapped_size
        self.num_device_free += 1

    # -- views ------------------------------------------------------------------------------------
    @property
    def reserved_bytes(self) -> int:
        return self.total_allocated_memory

    @property
    def num_segments(self) -> int:
        return len(self.segments) + self._mapped_expandable


def _link_before(new: Block, block: Block) -> None:
    """Splice `new` into the segment's block list right before `block`."""
    new.prev = block.prev
    if new.prev is not None:
        new.prev.next = new
    new.next = block
    block.prev = new


def _link_after(block: Block, new: Block) -> None:
    """Splice `new` into the segment's block list right after `block`."""
    new.next = block.next
    if new.next is not None:
        new.next.prev = new
    new.prev = block
    block.next = new


def _expandable_size(block: Block) -> int:
    nxt = block.next
    return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """`roundup_power2_next_division`: round up to the next 1/divisions step of the power-of-two
    interval `size` lies in."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    power2_division = power2_floor >> (divisions.bit_length() - 1)
    if power2_division == 0:
        return power2_floor << 1
    round_size_floor = size & ~(power2_division - 1)
    return size if round_size_floor == size else round_size_floor + power2_division

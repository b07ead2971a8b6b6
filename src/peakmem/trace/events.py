"""An ordered list of device-memory events, stored column-wise so that building and replaying
hundreds of thousands of events stays cheap.

Each event has a kind, an allocation id (or a stream id for stream-wide events), a requested size
in bytes, a stream and a tag index. Tags (category, module path, phase, op) are interned: an event
holds the index of its tag in `Trace.tags`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import IO, Any

from peakmem.inputs import InputError, capped_lines, describe, open_regular_file

_JSON_TEXT = json.JSONEncoder().encode
"""json.dumps(value), bound at import: a job's result trace is written after the job ran, in
its process, and the job may have rebound `json.dumps` (capture/result_io.py)."""

FORMAT_NAME = "peakmem-trace"
FORMAT_VERSION = 1
NO_TAG = -1
HEADER_LINE_CAP = 64 * 2**20
"""The header line (meta and tags) may be this many bytes long."""
EVENT_LINE_CAP = 4096
"""An event line (`[kind,id,size,stream,tag]`) may be this many bytes long."""
MAX_SIZE = 2**63 - 1
MIN_INT = -(2**63)
MAX_INT = 2**63 - 1


class TraceFormatError(InputError):
    """A trace file that `Trace.load` cannot read (one line: FILE:LINE: what is wrong)."""


class EventKind(IntEnum):
    """What happened. The allocator simulation gives each kind the meaning written here."""

    ALLOC = 0
    """`id` asks for `size` bytes on `stream` (caching allocator malloc)."""
    FREE = 1
    """`id` is freed. If it was used on other streams (RECORD_STREAM) the block is only handed
    back once its uses are complete (FREE_COMPLETED, SYNCHRONIZE or EMPTY_CACHE)."""
    RECORD_STREAM = 2
    """`id` is used on `stream` besides its own (`Tensor.record_stream`)."""
    FREE_COMPLETED = 3
    """The other-stream uses of the freed `id` have completed: at the next malloc (its
    `process_events`) the block goes back to its pool."""
    SYNCHRONIZE = 4
    """Device-wide synchronisation of the allocator's events (`synchronize_and_free_events`):
    every deferred free is completed now."""
    EMPTY_CACHE = 5
    """`torch.cuda.empty_cache()`: release every cached unsplit segment (id ALL_POOLS; an id
    >= 1: only those of that private pool, once the pool is released)."""
    MARK = 6
    """A label in the timeline (e.g. the start of an optimizer step); no memory effect."""
    ALLOC_OR_SMALLER = 7
    """Like ALLOC, for a caller that can do with less: if the device cannot supply `size` bytes
    even after the allocator freed its cache, the request is halved until it fits (down to
    nothing). A library falling back to an algorithm with a smaller workspace (cuDNN's plans
    under memory pressure, Conv_v8.cpp) asks like this."""
    POOL_BEGIN = 8
    """`beginAllocateToPool`: private memory pool `id` (>= 1) is created, or its use count
    raised, and until its POOL_END every allocation is served from its own blocks (a CUDA graph
    capture, `torch.cuda.use_mem_pool`). A POOL_BEGIN right followed by its POOL_END is
    `createOrIncrefPool` (`torch.cuda.MemPool()`)."""
    POOL_END = 9
    """`endAllocateToPool`: allocations stop going to pool `id` (its blocks stay its own)."""
    POOL_RELEASE = 10
    """`releasePool`: pool `id`'s use count drops (a graph reset or destroyed, a MemPool
    deleted); at zero its wholly free segments are cudaFreed by the next EMPTY_CACHE."""


_ALLOC, _FREE = EventKind.ALLOC, EventKind.FREE
ALLOC_KINDS = frozenset({EventKind.ALLOC, EventKind.ALLOC_OR_SMALLER})
POOL_KINDS = frozenset({EventKind.POOL_BEGIN, EventKind.POOL_END, EventKind.POOL_RELEASE})
ALL_POOLS = -1
"""The id of an EMPTY_CACHE event that empties every pool (`torch.cuda.empty_cache()`); an id
>= 1 empties that private pool only (`emptyCache(mempool_id)`, a MemPool's destructor)."""


@dataclass(frozen=True, slots=True)
class Tag:
    """What an allocation is for; every field is optional."""

    category: str | None = None
    module: str | None = None
    phase: str | None = None
    op: str | None = None

    def to_json(self) -> list[str | None]:
        return [self.category, self.module, self.phase, self.op]

    @classmethod
    def from_json(cls, row: list[str | None]) -> Tag:
        if (
            not isinstance(row, list)
            or len(row) != 4
            or not all(field is None or isinstance(field, str) for field in row)
        ):
            raise ValueError(f"a tag is a list of 4 strings or nulls, got {describe(row)}")
        return cls(*row)


class Trace:
    """Ordered device-memory events.

    Build one with `alloc`/`free`/... ; read it back with `events()` or the columns
    (`kinds`, `ids`, `sizes`, `streams`, `tag_ids`).
    """

    __slots__ = (
        "kinds",
        "ids",
        "sizes",
        "streams",
        "tag_ids",
        "tags",
        "_tag_index",
        "_field_index",
        "_next_id",
        "meta",
    )

    def __init__(self, meta: dict[str, Any] | None = None) -> None:
        self.kinds: list[int] = []
        self.ids: list[int] = []
        self.sizes: list[int] = []
        self.streams: list[int] = []
        self.tag_ids: list[int] = []
        self.tags: list[Tag] = []
        self._tag_index: dict[Tag, int] = {}
        self._field_index: dict[tuple[str | None, ...], int] = {}
        """(category, module, phase, op) -> index: `intern_fields`' lookups (a tuple's hash and
        equality are C; a Tag's are generated Python)."""
        self._next_id = 0
        self.meta: dict[str, Any] = dict(meta or {})

    # -- building -----------------------------------------------------------------------------
    def intern(self, tag: Tag | None) -> int:
        """Index of `tag` in `self.tags`, adding it on first use."""
        if tag is None:
            return NO_TAG
        index = self._tag_index.get(tag)
        if index is None:
            index = len(self.tags)
            self.tags.append(tag)
            self._tag_index[tag] = index
        return index

    def intern_fields(
        self, category: str | None, module: str | None, phase: str | None, op: str | None
    ) -> int:
        """`intern(Tag(category, module, phase, op))`, without making the Tag once it is known."""
        key = (category, module, phase, op)
        index = self._field_index.get(key)
        if index is None:
            index = self._field_index[key] = self.intern(Tag(category, module, phase, op))
        return index

    def _append(self, kind: int, ident: int, size: int, stream: int, tag_id: int) -> None:
        self.kinds.append(kind)
        self.ids.append(ident)
        self.sizes.append(size)
        self.streams.append(stream)
        self.tag_ids.append(tag_id)

    def alloc(
        self,
        size: int,
        stream: int = 0,
        *,
        tag: Tag | None = None,
        ident: int | None = None,
        category: str | None = None,
        module: str | None = None,
        phase: str | None = None,
        op: str | None = None,
        or_smaller: bool = False,
        tag_id: int | None = None,
    ) -> int:
        """Record an allocation of `size` requested bytes; returns its id. `or_smaller`: the
        caller accepts a smaller block under memory pressure (EventKind.ALLOC_OR_SMALLER).
        `tag_id`: the tag's index, interned already (then `tag` and its fields are not read)."""
        if not 0 <= size <= MAX_SIZE:  # one test on the common path
            if size < 0:
                raise ValueError(f"allocation size must be >= 0, got {size}")
            # what CUDA's allocator takes (ssize_t): torch.cuda.caching_allocator_alloc(2**70)
            # was recorded, and its result refused as malformed (bad_result)
            raise OverflowError("Python int too large to convert to C ssize_t")
        if tag_id is None and tag is None and (category or module or phase or op):
            tag = Tag(category, module, phase, op)
        if ident is None:
            ident = self._next_id
            self._next_id += 1
        elif ident >= self._next_id:
            self._next_id = ident + 1
        kind = EventKind.ALLOC_OR_SMALLER if or_smaller else EventKind.ALLOC
        self._append(kind, ident, size, stream, self.intern(tag) if tag_id is None else tag_id)
        return ident

    def alloc_tagged(self, size: int, stream: int, tag_id: int) -> int:
        """`alloc(size, stream, tag_id=tag_id)`: the capture's per-op call, one frame."""
        if not 0 <= size <= MAX_SIZE:
            return self.alloc(size, stream, tag_id=tag_id)  # raises as it does
        ident = self._next_id
        self._next_id = ident + 1
        self.kinds.append(_ALLOC)
        self.ids.append(ident)
        self.sizes.append(size)
        self.streams.append(stream)
        self.tag_ids.append(tag_id)
        return ident

    def free(self, ident: int) -> None:
        self.kinds.append(_FREE)  # `_append`'s body: once per freed storage
        self.ids.append(ident)
        self.sizes.append(0)
        self.streams.append(0)
        self.tag_ids.append(NO_TAG)

    def retract_last_alloc(self, ident: int) -> bool:
        """Withdraw the last event if it is the allocation of `ident` (an allocation the
        capture learns, right after making it, that the GPU run reuses another block for);
        returns whether it did."""
        if not self.kinds or self.ids[-1] != ident or self.kinds[-1] not in ALLOC_KINDS:
            return False
        for column in (self.kinds, self.ids, self.sizes, self.streams, self.tag_ids):
            column.pop()
        return True

    def record_stream(self, ident: int, stream: int) -> None:
        self._append(EventKind.RECORD_STREAM, ident, 0, stream, NO_TAG)

    def free_completed(self, ident: int) -> None:
        self._append(EventKind.FREE_COMPLETED, ident, 0, 0, NO_TAG)

    def synchronize(self) -> None:
        self._append(EventKind.SYNCHRONIZE, -1, 0, 0, NO_TAG)

    def empty_cache(self, pool: int = ALL_POOLS) -> None:
        self._append(EventKind.EMPTY_CACHE, pool, 0, 0, NO_TAG)

    def pool_begin(self, pool: int) -> None:
        """Allocations go to private pool `pool` (>= 1) until `pool_end(pool)`."""
        self._append(EventKind.POOL_BEGIN, _pool_id(pool), 0, 0, NO_TAG)

    def pool_end(self, pool: int) -> None:
        self._append(EventKind.POOL_END, _pool_id(pool), 0, 0, NO_TAG)

    def pool_release(self, pool: int) -> None:
        self._append(EventKind.POOL_RELEASE, _pool_id(pool), 0, 0, NO_TAG)

    def mark(self, label: str) -> None:
        self._append(EventKind.MARK, -1, 0, 0, self.intern(Tag(op=label)))

    # -- reading ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.kinds)

    def events(self) -> Iterator[tuple[int, int, int, int, int]]:
        """(kind, id, size, stream, tag_id) for each event, in order."""
        return zip(self.kinds, self.ids, self.sizes, self.streams, self.tag_ids, strict=True)

    def tag_of(self, index: int) -> Tag | None:
        tag_id = self.tag_ids[index]
        return None if tag_id == NO_TAG else self.tags[tag_id]

    def live_at(self, index: int) -> dict[int, int]:
        """Allocations live just after event `index`: {id: requested size}."""
        live: dict[int, int] = {}
        for i in range(index + 1):
            kind = self.kinds[i]
            if kind == EventKind.ALLOC:
                live[self.ids[i]] = i
            elif kind == EventKind.FREE:
                live.pop(self.ids[i], None)
        return {ident: self.sizes[i] for ident, i in live.items()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return (
            self.kinds == other.kinds
            and self.ids == other.ids
            and self.sizes == other.sizes
            and self.streams == other.streams
            and [self.tag_of(i) for i in range(len(self))]
            == [other.tag_of(i) for i in range(len(other))]
        )

    # -- serialisation (JSON lines: a header, then one compact array per event) ----------------
    def dump(self, path: str | Path | IO[str]) -> None:
        """Write the trace as JSON lines."""
        if isinstance(path, (str, Path)):
            with open(path, "w", encoding="utf-8") as handle:
                self._dump(handle)
        else:
            self._dump(path)

    def _dump(self, out: IO[str]) -> None:
        header = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "meta": self.meta,
            "tags": [t.to_json() for t in self.tags],
        }
        out.write(_JSON_TEXT(header) + "\n")
        lines = [f"[{k},{i},{s},{st},{t}]" for k, i, s, st, t in self.events()]
        if lines:
            out.write("\n".join(lines) + "\n")

    @classmethod
    def load(cls, path: str | Path | IO[str] | IO[bytes]) -> Trace:
        """Read a trace written by `dump`. Every field is checked (types, ranges, line lengths,
        the input-file cap); a problem raises TraceFormatError (a ValueError) naming the file
        and line. Blank lines may only end the file, so that event i is on line i + 2."""
        is_path = isinstance(path, (str, Path))
        name = os.fspath(path) if is_path else str(getattr(path, "name", None) or "<trace>")
        try:
            if is_path:
                with open_regular_file(name) as handle:
                    return cls._load(handle, name)
            return cls._load(path, name)  # type: ignore[arg-type]
        except TraceFormatError:
            raise
        except InputError as exc:
            raise TraceFormatError(exc.detail, exc.path or name, exc.line) from None
        except OSError as exc:
            raise TraceFormatError(f"cannot read it ({exc.strerror or exc})", name) from None

    @classmethod
    def _load(cls, handle: IO[str] | IO[bytes], name: str) -> Trace:
        lines = capped_lines(handle, name, HEADER_LINE_CAP, EVENT_LINE_CAP)
        first = next(lines, None)
        if first is None:
            raise TraceFormatError("empty file, not a peakmem trace", name, 1)
        header = _json_line(
            first[1].removeprefix("\ufeff"), name, 1, "not a peakmem trace: the first line is not JSON"
        )
        trace = _trace_from_header(header, name)
        valid_kinds = {int(k) for k in EventKind}
        blank_at: int | None = None
        for lineno, text in lines:
            if not text.strip():
                blank_at = blank_at or lineno
                continue
            if blank_at is not None:
                raise TraceFormatError("blank line inside the events", name, blank_at)
            row = _json_line(text, name, lineno, "expected [kind, id, size, stream, tag]")
            if not isinstance(row, list) or len(row) != 5:
                raise TraceFormatError(
                    f"expected [kind, id, size, stream, tag], got {describe(row)}"
                    + (f" of {len(row)} items" if isinstance(row, list) else ""),
                    name,
                    lineno,
                )
            for field, value in zip(("kind", "id", "size", "stream", "tag"), row, strict=True):
                if not isinstance(value, int) or isinstance(value, bool):
                    raise TraceFormatError(
                        f"{field} is {describe(value)}, expected an integer", name, lineno
                    )
            kind, ident, size, stream, tag_id = row
            if kind not in valid_kinds:
                raise TraceFormatError(f"unknown event kind {describe(kind)}", name, lineno)
            if not MIN_INT <= ident <= MAX_INT or not MIN_INT <= stream <= MAX_INT:
                raise TraceFormatError("id or stream out of the 64-bit range", name, lineno)
            if kind in ALLOC_KINDS:
                if not 0 <= size <= MAX_SIZE:
                    raise TraceFormatError(
                        f"size is {describe(size)}, expected 0 to {MAX_SIZE} bytes", name, lineno
                    )
                if ident < 0:
                    raise TraceFormatError(
                        f"an allocation id must be >= 0, got {ident}", name, lineno
                    )
            elif size != 0:
                raise TraceFormatError(
                    f"size is {describe(size)} on a {EventKind(kind).name} event (only "
                    "allocations have a size)",
                    name,
                    lineno,
                )
            if kind in POOL_KINDS and ident < 1:
                raise TraceFormatError(
                    f"a private pool id must be >= 1, got {ident}", name, lineno
                )
            if tag_id != NO_TAG and not 0 <= tag_id < len(trace.tags):
                raise TraceFormatError(f"tag index {tag_id} out of range", name, lineno)
            trace._append(kind, ident, size, stream, tag_id)
            if kind in ALLOC_KINDS and ident >= trace._next_id:
                trace._next_id = ident + 1
        return trace


def _pool_id(pool: int) -> int:
    if pool < 1:
        raise ValueError(f"a private pool id must be >= 1, got {pool}")
    return pool


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number peakmem accepts")


def _json_line(text: str, name: str, lineno: int, what: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise TraceFormatError(f"{what} (nested too deeply)", name, lineno) from None
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{what} ({exc.msg})", name, lineno) from None
    except ValueError as exc:  # NaN/Infinity, integers of more than 4300 digits
        raise TraceFormatError(f"{what} ({exc})", name, lineno) from None


def _trace_from_header(header: Any, name: str) -> Trace:
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise TraceFormatError("not a peakmem trace: missing the peakmem-trace header", name, 1)
    version = header.get("version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise TraceFormatError(f"unsupported trace version {describe(version)}", name, 1)
    meta = header.get("meta")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise TraceFormatError(f"header 'meta' is {describe(meta)}, expected an object", name, 1)
    tags = header.get("tags", [])
    if not isinstance(tags, list):
        raise TraceFormatError(f"header 'tags' is {describe(tags)}, expected a list", name, 1)
    trace = Trace(meta=meta)
    for index, row in enumerate(tags):
        try:
            tag = Tag.from_json(row)
        except ValueError as exc:
            raise TraceFormatError(f"header tag {index}: {exc}", name, 1) from None
        if tag in trace._tag_index:
            raise TraceFormatError(
                f"header tag {index} repeats tag {trace._tag_index[tag]}", name, 1
            )
        trace.intern(tag)
    return trace

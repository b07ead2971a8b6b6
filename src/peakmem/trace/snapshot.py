"""Read a PyTorch memory snapshot (`torch.cuda.memory._snapshot()` / `_dump_snapshot()`) into a
Trace, plus what the snapshot itself recorded about reserved memory.

Actions of `device_traces` and what they become:
- `alloc` -> ALLOC of its requested size (the snapshot records the unrounded request);
- `free_requested` -> FREE. When its `free_completed` does not follow at once, the block was
  waiting on other streams: the FREE is preceded by a RECORD_STREAM on a pseudo stream and the
  later `free_completed` becomes FREE_COMPLETED;
- `segment_alloc`/`segment_map` and `segment_free`/`segment_unmap` give the recorded reserved
  memory over time. A run of segment frees that no new segment follows (not the allocator's own
  retry) was a user `empty_cache()`, and becomes EMPTY_CACHE;
- `oom` is remembered; `snapshot` and `user_defined` are skipped.

Snapshots are untrusted: `load_snapshot` unpickles with `safe_pickle.PlainDataUnpickler`
(no global, so no code from the file runs) under the input-file cap, and `snapshot_to_trace`
checks the type and range of every field it reads. Problems raise SnapshotError, one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peakmem.inputs import InputError, describe, open_regular_file, read_capped
from peakmem.inputs import max_input_bytes as _max_input_bytes
from peakmem.trace.events import Trace
from peakmem.trace.safe_pickle import loads_plain

PSEUDO_OTHER_STREAM = -1
MAX_ADDRESS = 2**64 - 1
MAX_SIZE = 2**63 - 1
"""Sizes and addresses are size_t / uintptr_t in the allocator: larger values are not real."""
MAX_STREAM = 2**64 - 1
_KNOWN_ACTIONS = {
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
    "user_defined",
}
_SEGMENT_GROWTH = {"segment_alloc", "segment_map"}
_SEGMENT_RELEASE = {"segment_free", "segment_unmap"}
_SKIPPED = {"snapshot", "user_defined"}


class SnapshotError(InputError):
    """The file is not a usable memory snapshot."""


@dataclass
class RecordedFacts:
    """What the snapshot itself says about the run."""

    has_segment_events: bool = False
    peak_reserved_bytes: int | None = None
    """Peak of reserved memory over the trace, from segment events (None without them)."""
    final_reserved_bytes: int | None = None
    """Reserved memory in the snapshot's `segments` (the state when it was taken)."""
    baseline_reserved_bytes: int = 0
    """Reserved memory before the first trace entry (segments older than the trace)."""
    oom_events: int = 0
    alloc_conf: str | None = None
    device: int = 0
    streams: dict[int, int] = field(default_factory=dict)
    """Snapshot stream handle -> stream id in the trace."""
    segment_addresses: list[tuple[int, int]] = field(default_factory=list)
    """(size, address) of each recorded `segment_alloc`, in order."""


def load_snapshot(path: str | Path, max_bytes: int | None = None) -> dict[str, Any]:
    """Unpickle a snapshot file safely: a regular file of at most `max_bytes` (default: the
    input-file cap, PEAKMEM_MAX_INPUT_BYTES or 2 GiB) holding only plain data, whose top level
    is a dict. Raises SnapshotError (one line naming the file) for anything else."""
    name = os.fspath(path)
    try:
        cap = _max_input_bytes() if max_bytes is None else max_bytes
        with open_regular_file(name, cap) as handle:
            data = read_capped(handle, cap, name)
        snapshot = loads_plain(data)
    except InputError as exc:
        raise SnapshotError(exc.detail, exc.path or name, exc.line) from None
    except OSError as exc:
        raise SnapshotError(f"cannot read it ({exc.strerror or exc})", name) from None
    if not isinstance(snapshot, dict):
        raise SnapshotError(
            f"not a memory snapshot: the pickle holds {describe(snapshot)}, not a dict "
            "(write one with torch.cuda.memory._dump_snapshot())",
            name,
        )
    return snapshot


def snapshot_to_trace(snapshot: Any, device: int | None = None) -> tuple[Trace, RecordedFacts]:
    """Convert a snapshot dict into a Trace of one device (default: the device with events).
    Every field read is checked; SnapshotError says which entry and field is wrong."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise SnapshotError(
            "not a memory snapshot: expected a dict with 'device_traces' "
            "(from torch.cuda.memory._snapshot() or _dump_snapshot())"
        )
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError("'device_traces' must be a list of per-device event lists")
    if device is not None and (not isinstance(device, int) or isinstance(device, bool)):
        raise SnapshotError(f"device must be an integer, got {describe(device)}")
    if device is None:
        with_events = [i for i, t in enumerate(traces) if t]
        if len(with_events) > 1:
            raise SnapshotError(
                f"the snapshot has events on devices {with_events}: choose one with --device"
            )
        device = with_events[0] if with_events else 0
    if not 0 <= device < max(len(traces), 1):
        raise SnapshotError(f"the snapshot has no device {device} (it has {len(traces)})")
    entries = traces[device] if traces else []
    for position, entry in enumerate(entries):
        _check_entry(entry, device, position)

    facts = RecordedFacts(device=device, alloc_conf=_alloc_conf(snapshot))
    trace = Trace(meta={"source": "torch memory snapshot", "device": device})
    live: dict[int, int] = {}  # address -> trace id
    made_at: dict[int, int] = {}  # address -> entry position of its live alloc
    deferred: dict[int, int] = {}  # address -> trace id of a free waiting on other streams
    reserved = 0
    peak_reserved = 0
    n = len(entries)
    for position, entry in enumerate(entries):
        action = entry["action"]
        if action in _SKIPPED:
            continue
        where = f"device_traces[{device}][{position}] ({action})"
        addr = _int_field(entry, "addr", where, MAX_ADDRESS) if action != "oom" else 0
        if action == "alloc":
            size = _int_field(entry, "size", where, MAX_SIZE)
            stream = _stream_id(facts, entry, where)
            if addr in live:
                raise SnapshotError(
                    f"{where}: alloc at address {addr:#x}, which entry {made_at[addr]} "
                    "allocated and no entry freed"
                )
            live[addr] = trace.alloc(size, stream)
            made_at[addr] = position
        elif action == "free_requested":
            ident = live.pop(addr, None)
            if ident is None:
                raise SnapshotError(
                    f"{where}: free of address {addr:#x}, which no earlier 'alloc' "
                    "made (was memory history recorded after allocations were made, or did the "
                    "ring buffer drop early entries?)"
                )
            made_at.pop(addr, None)
            following = entries[position + 1] if position + 1 < n else None
            completes_now = (
                following is not None
                and following["action"] == "free_completed"
                and _same_int(following.get("addr"), addr)
            )
            if not completes_now:
                trace.record_stream(ident, PSEUDO_OTHER_STREAM)
                deferred[addr] = ident
            trace.free(ident)
        elif action == "free_completed":
            ident = deferred.pop(addr, None)
            if ident is not None:
                trace.free_completed(ident)
        elif action in _SEGMENT_GROWTH:
            facts.has_segment_events = True
            size = _int_field(entry, "size", where, MAX_SIZE)
            if action == "segment_alloc":
                facts.segment_addresses.append((size, addr))
            reserved += size
            peak_reserved = max(peak_reserved, reserved)
        elif action in _SEGMENT_RELEASE:
            facts.has_segment_events = True
            size = _int_field(entry, "size", where, MAX_SIZE)
            if _starts_user_release(entries, position):
                trace.empty_cache()
            reserved -= size
        elif action == "oom":
            facts.oom_events += 1

    final = _segments_total(snapshot, device)
    facts.final_reserved_bytes = final
    if facts.has_segment_events:
        # Segments made before the first recorded entry still count as reserved.
        baseline = max(0, final - reserved) if final is not None else 0
        facts.baseline_reserved_bytes = baseline
        facts.peak_reserved_bytes = baseline + peak_reserved
    return trace, facts


def _check_entry(entry: Any, device: int, position: int) -> None:
    where = f"device_traces[{device}][{position}]"
    if not isinstance(entry, dict):
        raise SnapshotError(f"{where} is {describe(entry)}, not a dict with an 'action'")
    action = entry.get("action")
    if not isinstance(action, str):
        raise SnapshotError(f"{where} has no 'action' string (got {describe(action)})")
    if action not in _KNOWN_ACTIONS:
        raise SnapshotError(f"{where} has unknown action {describe(action)}")


def _same_int(value: Any, addr: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value == addr


def _starts_user_release(entries: list[dict[str, Any]], position: int) -> bool:
    """True at the first segment release of a run that no segment growth ends (the allocator's
    own releases in malloc are always followed by a new segment or an OOM)."""
    if position > 0 and entries[position - 1]["action"] in _SEGMENT_RELEASE:
        return False
    for entry in entries[position + 1 :]:
        action = entry["action"]
        if action in _SEGMENT_RELEASE:
            continue
        return action not in _SEGMENT_GROWTH and action != "oom"
    return True


def _stream_id(facts: RecordedFacts, entry: dict[str, Any], where: str) -> int:
    handle = entry.get("stream", 0)
    if handle is None:
        handle = 0
    if not isinstance(handle, int) or isinstance(handle, bool) or not 0 <= handle <= MAX_STREAM:
        raise SnapshotError(
            f"{where}: 'stream' is {describe(handle)}, expected a stream handle (an integer >= 0)"
        )
    if handle == 0:
        return 0
    if handle not in facts.streams:
        facts.streams[handle] = len(facts.streams) + 1
    return facts.streams[handle]


def _int_field(entry: dict[str, Any], key: str, where: str, maximum: int) -> int:
    value = entry.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        got = "missing" if key not in entry else describe(value)
        raise SnapshotError(f"{where}: has no integer {key!r} from 0 to {maximum} (got {got})")
    return value


def _segments_total(snapshot: dict[str, Any], device: int) -> int | None:
    """Reserved bytes of `device`'s segments in the snapshot; None without a `segments` list."""
    segments = snapshot.get("segments")
    if segments is None:
        return None
    if not isinstance(segments, list):
        raise SnapshotError(f"'segments' is {describe(segments)}, expected a list")
    total = 0
    for index, segment in enumerate(segments):
        if not isinstance(segment, dict):
            raise SnapshotError(f"segments[{index}] is {describe(segment)}, expected a dict")
        owner = segment.get("device", device)
        if not isinstance(owner, int) or isinstance(owner, bool):
            raise SnapshotError(
                f"segments[{index}]: 'device' is {describe(owner)}, expected an integer"
            )
        if owner != device:
            continue
        total += _int_field(segment, "total_size", f"segments[{index}]", MAX_SIZE)
    return total


def _alloc_conf(snapshot: dict[str, Any]) -> str | None:
    settings = snapshot.get("allocator_settings")
    if settings is None:
        return None
    if not isinstance(settings, dict):
        raise SnapshotError(f"'allocator_settings' is {describe(settings)}, expected a dict")
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        conf = settings.get(key)
        if conf is None or conf == "":
            continue
        if not isinstance(conf, str) or len(conf) > 4096:
            raise SnapshotError(
                f"allocator_settings[{key!r}] is {describe(conf)}, expected a short string"
            )
        return conf
    return None

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
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peakmem.trace.events import Trace

PSEUDO_OTHER_STREAM = -1
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


class SnapshotError(ValueError):
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


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Unpickle a snapshot file, with clear errors for anything else."""
    try:
        with open(path, "rb") as handle:
            data = pickle.load(handle)
    except FileNotFoundError:
        raise SnapshotError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise SnapshotError(f"{path} is a directory, not a snapshot file") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        AttributeError,
        ImportError,
        IndexError,
        ValueError,
    ) as exc:
        raise SnapshotError(f"{path} is not a pickled memory snapshot ({exc})") from None
    return data


def snapshot_to_trace(snapshot: Any, device: int | None = None) -> tuple[Trace, RecordedFacts]:
    """Convert a snapshot dict into a Trace of one device (default: the device with events)."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise SnapshotError(
            "not a memory snapshot: expected a dict with 'device_traces' "
            "(from torch.cuda.memory._snapshot() or _dump_snapshot())"
        )
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError("'device_traces' must be a list of per-device event lists")
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
        if not isinstance(entry, dict) or "action" not in entry:
            raise SnapshotError(f"trace entry {position} is not a dict with an 'action'")
        if entry["action"] not in _KNOWN_ACTIONS:
            raise SnapshotError(f"trace entry {position} has unknown action {entry['action']!r}")

    facts = RecordedFacts(device=device, alloc_conf=_alloc_conf(snapshot))
    trace = Trace(meta={"source": "torch memory snapshot", "device": device})
    live: dict[int, int] = {}  # address -> trace id
    deferred: dict[int, int] = {}  # address -> trace id of a free waiting on other streams
    reserved = 0
    peak_reserved = 0
    n = len(entries)
    for position, entry in enumerate(entries):
        action = entry["action"]
        addr = _int_field(entry, "addr", position) if action != "oom" else 0
        if action == "alloc":
            size = _int_field(entry, "size", position)
            stream = _stream_id(facts, entry)
            live[addr] = trace.alloc(size, stream)
        elif action == "free_requested":
            ident = live.pop(addr, None)
            if ident is None:
                raise SnapshotError(
                    f"trace entry {position}: free of address {addr:#x}, which no earlier 'alloc' "
                    "made (was memory history recorded after allocations were made, or did the "
                    "ring buffer drop early entries?)"
                )
            completes_now = (
                position + 1 < n
                and entries[position + 1]["action"] == "free_completed"
                and entries[position + 1].get("addr") == addr
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
            if action == "segment_alloc":
                facts.segment_addresses.append((_int_field(entry, "size", position), addr))
            reserved += _int_field(entry, "size", position)
            peak_reserved = max(peak_reserved, reserved)
        elif action in _SEGMENT_RELEASE:
            facts.has_segment_events = True
            if _starts_user_release(entries, position):
                trace.empty_cache()
            reserved -= _int_field(entry, "size", position)
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


def _stream_id(facts: RecordedFacts, entry: dict[str, Any]) -> int:
    handle = entry.get("stream", 0) or 0
    if handle == 0:
        return 0
    if handle not in facts.streams:
        facts.streams[handle] = len(facts.streams) + 1
    return facts.streams[handle]


def _int_field(entry: dict[str, Any], key: str, position: int) -> int:
    value = entry.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise SnapshotError(
            f"trace entry {position} ({entry.get('action')}) has no integer {key!r}"
        )
    return value


def _segments_total(snapshot: dict[str, Any], device: int) -> int | None:
    segments = snapshot.get("segments")
    if not isinstance(segments, list):
        return None
    total = 0
    for segment in segments:
        if not isinstance(segment, dict) or segment.get("device", device) != device:
            continue
        if isinstance(segment.get("total_size"), int):
            total += segment["total_size"]
    return total


def _alloc_conf(snapshot: dict[str, Any]) -> str | None:
    settings = snapshot.get("allocator_settings")
    if isinstance(settings, dict):
        conf = settings.get("PYTORCH_CUDA_ALLOC_CONF") or settings.get("PYTORCH_ALLOC_CONF")
        if isinstance(conf, str):
            return conf
    return None

"""Snapshot -> Trace conversion, on snapshots written the way PyTorch records them."""

import pytest

from peakmem.allocator import simulate
from peakmem.trace import EventKind
from peakmem.trace.snapshot import SnapshotError, snapshot_to_trace

MiB = 1024 * 1024
BASE = 0x7F0000000000


def entry(action, addr, size, stream=0):
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": stream,
        "time_us": 0,
        "frames": [],
    }


def snapshot(entries, segments=None, conf=None):
    snap = {"segments": segments or [], "device_traces": [entries]}
    if conf is not None:
        snap["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": conf}
    return snap


def training_like_entries():
    """What PyTorch records for: a = 4 MiB; b = 4 MiB; free a; c = 18 MiB (new segment)."""
    return [
        entry("segment_alloc", BASE, 20 * MiB),
        entry("alloc", BASE, 4 * MiB),
        entry("alloc", BASE + 4 * MiB, 4 * MiB),
        entry("free_requested", BASE, 4 * MiB),
        entry("free_completed", BASE, 4 * MiB),
        entry("segment_alloc", BASE + 20 * MiB, 18 * MiB),
        entry("alloc", BASE + 20 * MiB, 18 * MiB),
    ]


def test_alloc_and_free_become_trace_events_and_recorded_peak_is_summed():
    trace, facts = snapshot_to_trace(snapshot(training_like_entries()))
    assert [EventKind(k) for k in trace.kinds] == [
        EventKind.ALLOC,
        EventKind.ALLOC,
        EventKind.FREE,
        EventKind.ALLOC,
    ]
    assert trace.sizes[0] == 4 * MiB
    assert facts.has_segment_events
    assert facts.peak_reserved_bytes == 38 * MiB
    assert simulate(trace).peak_reserved_bytes == 38 * MiB


def test_free_completed_later_means_a_deferred_free():
    entries = [
        entry("segment_alloc", BASE, 20 * MiB),
        entry("alloc", BASE, 4 * MiB),
        entry("free_requested", BASE, 4 * MiB),  # used on another stream: completes later
        entry("segment_alloc", BASE + 20 * MiB, 18 * MiB),
        entry("alloc", BASE + 20 * MiB, 18 * MiB),
        entry("free_completed", BASE, 4 * MiB),
        entry("alloc", BASE, 18 * MiB),
    ]
    trace, facts = snapshot_to_trace(snapshot(entries))
    assert EventKind.RECORD_STREAM in trace.kinds
    assert EventKind.FREE_COMPLETED in trace.kinds
    r = simulate(trace)
    assert r.peak_reserved_bytes == facts.peak_reserved_bytes == 38 * MiB


def test_user_empty_cache_is_recognised_but_allocator_retry_is_not():
    user = [
        entry("segment_alloc", BASE, 20 * MiB),
        entry("alloc", BASE, 4 * MiB),
        entry("free_requested", BASE, 4 * MiB),
        entry("free_completed", BASE, 4 * MiB),
        entry("segment_free", BASE, 20 * MiB),  # empty_cache(): nothing allocated after it
        entry("segment_alloc", BASE, 2 * MiB),
        entry("alloc", BASE, 512),
    ]
    trace, _ = snapshot_to_trace(snapshot(user))
    assert EventKind.EMPTY_CACHE not in trace.kinds  # a new segment follows: a retry
    user[5:5] = [entry("user_defined", 0, 0)]
    trace, _ = snapshot_to_trace(snapshot(user))
    assert EventKind.EMPTY_CACHE in trace.kinds


def test_segments_older_than_the_trace_form_the_baseline():
    # a 20 MiB segment existed before recording started; the trace adds a 2 MiB one
    segments = [
        {"device": 0, "address": BASE, "total_size": 20 * MiB, "blocks": []},
        {"device": 0, "address": BASE + 20 * MiB, "total_size": 2 * MiB, "blocks": []},
    ]
    entries = [
        entry("segment_alloc", BASE + 20 * MiB, 2 * MiB),
        entry("alloc", BASE + 20 * MiB, 512),
    ]
    _, facts = snapshot_to_trace(snapshot(entries, segments))
    assert facts.baseline_reserved_bytes == 20 * MiB
    assert facts.peak_reserved_bytes == 22 * MiB


def test_streams_are_numbered_in_order_of_appearance():
    entries = [
        entry("alloc", BASE, 512, stream=0),
        entry("alloc", BASE + 512, 512, stream=94000),
        entry("alloc", BASE + 1024, 512, stream=93000),
    ]
    trace, facts = snapshot_to_trace(snapshot(entries))
    assert trace.streams == [0, 1, 2]
    assert facts.streams == {94000: 1, 93000: 2}


def test_recorded_alloc_conf_is_read():
    _, facts = snapshot_to_trace(snapshot([], conf="expandable_segments:True"))
    assert facts.alloc_conf == "expandable_segments:True"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([1, 2], "expected a dict"),
        ({"segments": []}, "device_traces"),
        ({"device_traces": [[{"addr": 1}]]}, "action"),
        ({"device_traces": [[{"action": "teleport", "addr": 0, "size": 0}]]}, "unknown action"),
        ({"device_traces": [[entry("free_requested", BASE, 512)]]}, "no earlier 'alloc'"),
        ({"device_traces": [[{"action": "alloc", "addr": BASE}]]}, "integer 'size'"),
    ],
)
def test_bad_snapshots_get_clear_errors(bad, message):
    with pytest.raises(SnapshotError, match=message):
        snapshot_to_trace(bad)

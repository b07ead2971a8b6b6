"""Replay every real GPU snapshot committed under tests/data/snapshots/ (recorded with
benchmarks/snapshots/record.py) and require the simulated peak reserved to equal the recorded
one, and torch's own max_memory_reserved where the job's JSON gives it."""

import json
from pathlib import Path

import pytest

from peakmem.allocator import simulate
from peakmem.trace.snapshot import load_snapshot, snapshot_to_trace

SNAPSHOTS = sorted((Path(__file__).parent.parent / "data" / "snapshots").glob("*.pickle"))


@pytest.mark.skipif(not SNAPSHOTS, reason="no real GPU snapshots committed yet")
@pytest.mark.parametrize("path", SNAPSHOTS, ids=[p.stem for p in SNAPSHOTS])
def test_replay_reproduces_recorded_peak_reserved(path):
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    trace, facts = snapshot_to_trace(load_snapshot(path))
    result = simulate(
        trace,
        facts.alloc_conf or meta.get("alloc_conf", ""),
        torch_version=meta.get("torch"),
        segment_address_hints=facts.segment_addresses,
    )
    assert result.peak_reserved_bytes + facts.baseline_reserved_bytes == facts.peak_reserved_bytes
    if "max_memory_reserved" in meta:
        assert result.peak_reserved_bytes == meta["max_memory_reserved"]

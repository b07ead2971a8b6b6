"""`peakmem estimate --snapshot`: the simulated run as a torch.cuda.memory._snapshot() pickle."""

from __future__ import annotations

import json
import pickle
import random
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from torch.cuda import _memory_viz

from peakmem.allocator.config import AllocatorConfig
from peakmem.allocator.simulate import simulate
from peakmem.cli.main import main
from peakmem.estimate.api import estimate_command
from peakmem.estimate.memory_snapshot import build_snapshot, estimate_snapshot, write_snapshot
from peakmem.trace.events import Trace
from peakmem.trace.snapshot import load_snapshot, snapshot_to_trace

MIB = 2**20


def _flame(lines: str) -> str:
    """torch's format_flamegraph downloads flamegraph.pl; the folded lines are what it feeds it."""
    return lines


def _check_with_torch(snapshot: dict) -> None:
    """Everything torch.cuda._memory_viz does with a snapshot works on ours."""
    data = pickle.loads(pickle.dumps(snapshot))
    summary = _memory_viz.segsum(data)  # asserts every segment's blocks add up
    reserved = sum(seg["total_size"] for seg in data["segments"])
    assert f"segments: {len(data['segments'])}" in summary
    assert reserved == 0 or "total_reserved" in summary
    text = _memory_viz.trace(data)
    assert f"{len(data['device_traces'][0])} entries" in text
    assert "cudaMalloc" in text or "segment_map" in text
    assert isinstance(_memory_viz.segments(data, format_flamegraph=_flame), str)
    assert isinstance(_memory_viz.memory(data, format_flamegraph=_flame), str)
    assert "snapshot.pickle" in _memory_viz.trace_plot(data)
    assert "Allocator State History" in _memory_viz.segment_plot(data)
    assert "Active Memory Timeline" in _memory_viz.trace_plot(_memory_viz.filter_alloc_free_pairs(
        pickle.loads(pickle.dumps(snapshot))))


def _round_trip_peak(snapshot: dict, torch_version: str | None = None) -> int:
    trace, facts = snapshot_to_trace(pickle.loads(pickle.dumps(snapshot)))
    conf = facts.alloc_conf or ""
    return simulate(trace, AllocatorConfig.parse(conf, torch_version),
                    torch_version).peak_reserved_bytes


def _random_trace(seed: int, streams: bool) -> Trace:
    rng = random.Random(seed)
    trace = Trace()
    live: list[int] = []
    for step in range(400):
        if live and rng.random() < 0.45:
            ident = live.pop(rng.randrange(len(live)))
            if streams and rng.random() < 0.2:
                trace.record_stream(ident, 7)
                trace.free(ident)
                trace.free_completed(ident)
            else:
                trace.free(ident)
        else:
            size = rng.choice([512, 4096, 300_000, 3 * MIB, 17 * MIB, 90 * MIB])
            live.append(trace.alloc(size, category=rng.choice(["activation", "temporary"]),
                                    module=f"model.layer{step % 3}", phase="forward", op="aten::mm"))
        if rng.random() < 0.02:
            trace.empty_cache()
        if rng.random() < 0.05:
            trace.mark("step")
    return trace


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:64"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traces_round_trip_and_open_in_torch(seed: int, conf: str) -> None:
    trace = _random_trace(seed, streams=not conf)
    config = AllocatorConfig.parse(conf, "2.6")
    snapshot = build_snapshot(trace, config, "2.6")
    _check_with_torch(snapshot)
    expected = simulate(trace, config, "2.6").peak_reserved_bytes
    if not conf.startswith("expandable"):
        assert _round_trip_peak(snapshot, "2.6") == expected
    # the end state: segments add up to what the simulated allocator still holds
    final = simulate(trace, config, "2.6").final_reserved_bytes
    assert sum(seg["total_size"] for seg in snapshot["segments"]) == final
    entries = snapshot["device_traces"][0]
    allocs = [e for e in entries if e["action"] == "alloc"]
    assert len(allocs) == sum(1 for k in trace.kinds if k == 0)
    assert allocs[0]["frames"][0] == {"filename": "<op>", "line": 0, "name": "aten::mm"}
    assert allocs[0]["frames"][1]["filename"].startswith("model.layer")


def test_waiting_free_is_active_awaiting_free_until_completed() -> None:
    trace = Trace()
    kept = trace.alloc(4 * MIB)
    other = trace.alloc(4 * MIB)
    trace.record_stream(other, 3)
    trace.free(other)
    snapshot = build_snapshot(trace, AllocatorConfig.parse("", "2.6"), "2.6")
    states = sorted(b["state"] for seg in snapshot["segments"] for b in seg["blocks"])
    assert "active_awaiting_free" in states and "active_allocated" in states
    actions = [e["action"] for e in snapshot["device_traces"][0]]
    assert actions.count("free_requested") == 1 and "free_completed" not in actions
    trace.free_completed(other)
    trace.free(kept)
    snapshot = build_snapshot(trace, AllocatorConfig.parse("", "2.6"), "2.6")
    actions = [e["action"] for e in snapshot["device_traces"][0]]
    assert actions.count("free_completed") == 1  # the deferred one waits for the next malloc
    trace.alloc(MIB)
    snapshot = build_snapshot(trace, AllocatorConfig.parse("", "2.6"), "2.6")
    actions = [e["action"] for e in snapshot["device_traces"][0]]
    assert actions.count("free_completed") == 2
    assert actions.index("free_completed", actions.index("free_completed") + 1) < \
        actions.index("alloc", 3)
    _check_with_torch(snapshot)


def test_capacity_records_the_oom() -> None:
    trace = Trace()
    trace.alloc(30 * MIB)
    trace.alloc(60 * MIB)
    snapshot = build_snapshot(trace, AllocatorConfig.parse("", "2.6"), "2.6",
                              capacity_bytes=64 * MIB)
    assert snapshot["device_traces"][0][-1]["action"] == "oom"
    assert "raise OutOfMemoryError" in _memory_viz.trace(snapshot)


def test_example_estimate_snapshot(tmp_path: Path) -> None:
    result = estimate_command(
        [sys.executable, "-m", "peakmem.examples.mlp_train", "--batch-size", "64", "--epochs", "1"],
        gpu="a100-40gb", isolate=False)
    path = write_snapshot(result, tmp_path / "run.pickle")
    data = load_snapshot(path)  # peakmem's own safe loader: plain data only
    _check_with_torch(data)
    assert _round_trip_peak(data, result.torch_version) == result.peak_reserved_bytes
    names = {f["name"] for e in data["device_traces"][0] for f in e["frames"]}
    assert any(name.startswith("parameter") for name in names)
    assert any(name.startswith("optimizer_state (optimizer)") for name in names)
    # `peakmem replay` of the snapshot gives the estimate's peak back
    out = CliRunner().invoke(main, ["replay", str(path), "--json", "--torch",
                                    result.torch_version])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["peak_reserved_bytes"] == result.peak_reserved_bytes
    assert estimate_snapshot(result) == data


def test_cli_writes_the_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "run.pickle"
    out = CliRunner().invoke(main, [
        "estimate", "--gpu", "l4", "--json", "--snapshot", str(path), "--", sys.executable,
        "-m", "peakmem.examples.mlp_train", "--batch-size", "32", "--epochs", "1",
        "--hidden", "512"])
    assert out.exit_code == 0, out.output
    estimate = json.loads(out.stdout)
    assert _round_trip_peak(load_snapshot(path), estimate["torch_version"]) == \
        estimate["peak_reserved_bytes"]
    bad = CliRunner().invoke(main, [
        "estimate", "--json", "--snapshot", str(tmp_path / "no" / "such.pickle"), "--",
        sys.executable, "-m", "peakmem.examples.mlp_train"])
    assert bad.exit_code == 2
    assert "cannot write the snapshot" in json.loads(bad.stdout)["error"]["message"]

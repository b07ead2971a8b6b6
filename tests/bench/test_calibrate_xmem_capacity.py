"""benchmarks/calibrate_xmem.py `CapacityReplays`: every candidate of the consumer-GPU fit is
replayed at its own capacity (GPU total - context - the candidate's bytes outside the
allocator), as the estimate replays a job, reusing the replay at the largest capacity wherever
its peak fits under the candidate's limit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from peakmem.trace.events import Trace

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
GIB = 2**30


@pytest.fixture(scope="module")
def calibrate():
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("calibrate_xmem", BENCHMARKS / "calibrate_xmem.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_each_candidate_gets_its_own_capacity(calibrate, monkeypatch):
    trace = Trace()
    first = trace.alloc(5 * GIB)
    trace.free(first)
    second = trace.alloc(8 * GIB)  # the cached 5 GiB block is too small: a second segment
    trace.free(second)
    item = ("00026", 0, "ok", trace, [], ())
    replays: list[int] = []
    original = calibrate.replay_classed

    def counted(captured, model, capacity, version):
        replays.append(capacity)
        return original(captured, model, capacity, version)

    monkeypatch.setattr(calibrate, "replay_classed", counted)
    runs = calibrate.CapacityReplays([(None, item)], lambda row, outside: 20 * GIB - outside, "2.6.0")
    # the largest capacity: both segments (13 GiB), and any limit above that reuses it
    assert runs.reserved(0, 1.0, {}, 4 * GIB) == 13 * GIB
    assert replays == [20 * GIB]
    # 10 GiB: cudaMalloc fails, the cache is released, the 8 GiB block fits alone
    assert runs.reserved(0, 1.0, {}, 10 * GIB) == 8 * GIB
    # 7 GiB: out of memory even after the release; a larger figure outside is not replayed
    assert runs.reserved(0, 1.0, {}, 13 * GIB) is None
    assert runs.reserved(0, 1.0, {}, 14 * GIB) is None
    assert replays == [20 * GIB, 10 * GIB, 7 * GIB]

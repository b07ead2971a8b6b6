"""benchmarks/xmem_segment_growth.py: the segments alive at the reserved peak, with the request
that made each one, its step and the cached free bytes at that moment."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from peakmem.allocator.config import AllocatorConfig
from peakmem.estimate.memory_snapshot import build_snapshot
from peakmem.trace.events import Trace

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "xmem_segment_growth.py"
MIB = 2**20


@pytest.fixture(scope="module")
def growth():
    spec = importlib.util.spec_from_file_location("xmem_segment_growth", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_a_backward_request_larger_than_any_free_block_is_a_new_segment(growth):
    trace = Trace()
    small = [trace.alloc(12 * MIB, category="activation", phase="forward", op="relu")
             for _ in range(3)]
    for ident in small:
        trace.free(ident)  # 3 x 12 MiB free in the cache: 36 MiB, no block of 30 MiB
    grad = trace.alloc(30 * MIB, category="temporary", phase="backward",
                       op="convolution_backward.default")
    trace.free(grad)
    trace.alloc(12 * MIB, category="activation", phase="forward", op="relu")  # step 2: reuses
    snapshot = build_snapshot(trace, AllocatorConfig.parse("", "2.6"), "2.6")

    births, peak, allocated = growth.segment_births(snapshot)

    assert [b.size for b in births] == [12 * MIB, 12 * MIB, 12 * MIB, 30 * MIB]
    assert peak == 66 * MIB and allocated == 0  # the peak comes as the 30 MiB segment is made
    last = births[-1]
    assert last.request == 30 * MIB
    assert last.cached_free == 36 * MIB
    assert last.phase == "temporary (backward)"
    assert "convolution_backward.default" in last.frames
    assert [b.step for b in births] == [1, 1, 1, 1]

"""benchmarks/workspace_scale_replay.py: a trace replayed with its cuDNN workspaces scaled (and
left as it was), and the allocated bytes a module's backward workspace starts from."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from peakmem.trace.events import Trace

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "workspace_scale_replay.py"
MiB = 2**20


@pytest.fixture(scope="module")
def replay():
    spec = importlib.util.spec_from_file_location("workspace_scale_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def conv_trace() -> Trace:
    """A 10 MiB activation, then a 4 MiB backward-weight workspace of Net.conv while it lives,
    then a 6 MiB gradient after both are gone."""
    trace = Trace()
    activation = trace.alloc(10 * MiB, category="activation", module="Net.conv", phase="forward")
    workspace = trace.alloc(4 * MiB, category="workspace", module="Net.conv", phase="backward",
                            op="cudnn_conv_workspace[backward_weight]", or_smaller=True)
    trace.free(workspace)
    trace.free(activation)
    trace.free(trace.alloc(6 * MiB, category="gradient", module="Net.conv", phase="backward"))
    return trace


def test_workspaces_scale_and_the_trace_is_left_as_it_was(replay):
    trace = conv_trace()
    sizes = list(trace.sizes)
    out = replay.replay_scaled(trace, "2.11.0", [0, 1, 2])
    # allocated peak: the activation plus the workspace; without it the activation alone
    assert {scale: allocated for scale, (_reserved, allocated) in out.items()} == {
        0: 10 * MiB, 1: 14 * MiB, 2: 18 * MiB}
    # reserved: a 10 MiB segment for the activation (>= 10 MiB: rounded to 2 MiB) and a 20 MiB
    # one for the workspace (a 1-10 MiB request); the 6 MiB gradient splits the activation's
    # freed block, the best fit. Without the workspace only the 10 MiB segment is ever needed.
    assert out[1][0] == 30 * MiB and out[2][0] == 30 * MiB
    assert out[0][0] == 10 * MiB
    assert list(trace.sizes) == sizes


def test_allocated_before_a_modules_backward_workspace(replay):
    before = replay.allocated_before(conv_trace(), "2.11.0", "Net.conv")
    assert before == {"cudnn_conv_workspace[backward_weight]": 10 * MiB}
    assert replay.allocated_before(conv_trace(), "2.11.0", "Net.other") == {}

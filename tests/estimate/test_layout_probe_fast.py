"""estimate/layout_probe.py: `probe_layout` (lean replays, workspace probes forked from the
unprobed replay at the first workspace allocation) reports exactly what `probe_layout_plain`
(one `simulate` of a probed copy of the trace per probe) does, probe for probe."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peakmem.allocator.simulate import TraceError, simulate
from peakmem.estimate import layout_probe
from peakmem.estimate.layout_probe import probe_layout, probe_layout_plain
from peakmem.trace.events import Trace

KiB, MiB = 1 << 10, 1 << 20

# sizes around every edge the probes work on: small pool (<= 1 MiB), the 20 MiB segments of
# large requests below 10 MiB, large requests of their own segment
SIZES = st.one_of(
    st.integers(1, 1 * MiB),
    st.integers(1 * MiB + 1, 10 * MiB),
    st.sampled_from([2 * MiB, 4 * MiB, 6 * MiB, 8 * MiB, 12 * MiB, 20 * MiB, 100 * MiB]),
    st.integers(10 * MiB, 120 * MiB),
)
CONFS = st.sampled_from([None, "", "max_split_size_mb:64", "roundup_power2_divisions:4",
                         "expandable_segments:True", "garbage_collection_threshold:0.6"])


@st.composite
def traces(draw) -> Trace:
    """Random allocations and frees on one or two streams, with marks, some cuBLAS workspace
    allocations, and now and then an event the lean replay leaves to `simulate`."""
    trace = Trace()
    live: list[int] = []
    for _ in range(draw(st.integers(0, 60))):
        action = draw(st.sampled_from(["alloc"] * 5 + ["free"] * 3 + ["workspace", "mark",
                                                                      "other"]))
        if action == "free" and live:
            trace.free(live.pop(draw(st.integers(0, len(live) - 1))))
        elif action == "workspace":
            live.append(trace.alloc(draw(st.sampled_from([32 * KiB, 4 * MiB, 8 * MiB])),
                                    op="cublas_workspace[8, 0]"))
        elif action == "mark":
            trace.mark(f"step {len(trace)}")
        elif action == "other" and draw(st.integers(0, 4)) == 0:
            if live and draw(st.booleans()):
                trace.record_stream(live[-1], 1)
            else:
                trace.empty_cache()
        else:
            live.append(trace.alloc(draw(SIZES), draw(st.sampled_from([0, 0, 0, 1])),
                                    or_smaller=draw(st.integers(0, 9)) == 0))
    return trace


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), conf=CONFS, version=st.sampled_from([None, "2.4.1", "2.13.0"]))
def test_the_fast_probes_equal_the_plain_replays(trace, conf, version):
    assert probe_layout(trace, conf, version) == probe_layout_plain(trace, conf, version)


@settings(max_examples=40, deadline=None)
@given(trace=traces(), sizes=st.lists(st.integers(1, 12 * MiB), max_size=3),
       workspace_sizes=st.lists(st.integers(1, 20 * MiB), max_size=3))
def test_the_fast_probes_equal_the_plain_replays_for_any_probe_sizes(trace, sizes,
                                                                      workspace_sizes):
    fast = probe_layout(trace, sizes=sizes, workspace_sizes=workspace_sizes)
    assert fast == probe_layout_plain(trace, sizes=sizes, workspace_sizes=workspace_sizes)


def no_plain_replay(monkeypatch) -> None:
    """Make `probe_layout_plain` fail: the fast path must answer alone."""
    def refuse(*args, **kwargs):
        raise AssertionError("the lean replay fell back to probe_layout_plain")
    monkeypatch.setattr(layout_probe, "probe_layout_plain", refuse)


def test_a_workspace_probe_starts_from_a_copy_of_the_replay_at_the_first_workspace(
        monkeypatch):
    """The forked replays must not share blocks with the unprobed one (nor fall back to the
    plain replays): each workspace size moves the peak its own way, and the unprobed peak is
    the unprobed trace's."""
    trace = Trace()
    trace.alloc(8 * MiB)
    first = trace.alloc(4 * MiB, op="cublas_workspace[8, 0]")
    grad = trace.alloc(100 * MiB, category="gradient")
    trace.free(grad)
    trace.alloc(12 * MiB)
    trace.alloc(100 * MiB, category="gradient")
    trace.free(first)
    expected = probe_layout_plain(trace)
    no_plain_replay(monkeypatch)
    probe = probe_layout(trace)
    assert probe == expected
    assert len({probe.moves[f"cublas workspace {size}"]
                for size in layout_probe.WORKSPACE_PROBE_SIZES}) > 1


def test_an_inconsistent_trace_raises_as_the_plain_replay_does():
    trace = Trace()
    trace.alloc(4 * MiB)
    trace.free(7)
    with pytest.raises(TraceError, match="not allocated"):
        probe_layout(trace)


def test_a_trace_only_simulate_replays_takes_the_plain_path(monkeypatch):
    trace = Trace()
    block = trace.alloc(4 * MiB)
    trace.record_stream(block, 1)
    trace.free(block)
    calls = []
    plain = layout_probe.probe_layout_plain
    monkeypatch.setattr(layout_probe, "probe_layout_plain",
                        lambda *args: calls.append(args) or plain(*args))
    assert probe_layout(trace) == plain(trace)
    assert len(calls) == 1


def test_probe_sizes_are_checked_as_the_plain_replay_checks_them():
    trace = Trace()
    trace.alloc(4 * MiB)
    with pytest.raises(ValueError, match="positive"):
        probe_layout(trace, sizes=[0])
    # no workspace in the trace: its probe sizes are never replayed, so never refused
    assert probe_layout(trace, workspace_sizes=[0]) == probe_layout_plain(
        trace, workspace_sizes=[0])


def embedding_job(steps: int = 3) -> None:
    """An embedding classifier trained with Adam on "cuda" (fake device tensors)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Embedding(200_000, 64), torch.nn.Flatten(),
                                torch.nn.Linear(64 * 16, 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(steps):
        optimizer.zero_grad()
        tokens = torch.randint(0, 200_000, (32, 16), device="cuda")
        model(tokens).sum().backward()
        optimizer.step()


@pytest.mark.parametrize("torch_version", ["2.4.1", "2.13.0"])
def test_a_captured_job_probes_the_same_on_the_fast_path(monkeypatch, torch_version):
    from peakmem.estimate import estimate

    result = estimate(embedding_job, gpu="a100-40gb", torch_version=torch_version)
    trace = result.capture.trace
    expected = probe_layout_plain(trace, result.alloc_conf, result.torch_version)
    assert any(name.startswith("cublas workspace") for name in expected.moves)
    no_plain_replay(monkeypatch)
    assert probe_layout(trace, result.alloc_conf, result.torch_version) == expected


STEP_SIZES = st.sampled_from([100, 256 * KiB, 1 * MiB, 2 * MiB, 6 * MiB, 12 * MiB, 40 * MiB])
"""A few sizes of each pool, so that steps reach a steady allocator state (and repeat)."""


@st.composite
def stepped_traces(draw) -> Trace:
    """Training-like traces: a few persistent blocks, then the same step body several times
    (fresh ids each step; some blocks live on into the next step, as gradients do), each step
    ended by a `step N` mark, now and then one step changed, and the last blocks freed. With
    `swap`, every step frees one of two persistent blocks of one size, which one drawn per step,
    and allocates its successor: the same requests each step, freeing different blocks."""
    trace = Trace()
    for _ in range(draw(st.integers(0, 3))):
        trace.alloc(draw(SIZES), op="parameter")
    swap = draw(st.one_of(st.none(), STEP_SIZES))
    pair = [trace.alloc(swap), trace.alloc(swap)] if swap is not None else []
    body = draw(st.lists(st.tuples(STEP_SIZES, st.integers(-1, 8), st.sampled_from([0, 0, 1])),
                         min_size=1, max_size=10))
    steps = draw(st.integers(2, 12))
    changed = draw(st.integers(0, 3 * steps))  # a step index past the last: none changed
    due: dict[tuple[int, int], list[int]] = {}
    for step in range(steps):
        if pair:
            which = draw(st.integers(0, 1))
            trace.free(pair[which])
            pair[which] = trace.alloc(swap)
        for position, (size, life, stream) in enumerate(body):
            for ident in due.pop((step, position), []):
                trace.free(ident)
            if step == changed and position == 0:
                size += 2 * MiB
            ident = trace.alloc(size, stream)
            if life >= 0:
                end = position + life + 1
                due.setdefault((step + end // len(body), end % len(body)), []).append(ident)
        trace.mark(f"step {step + 1}")
    for key in sorted(due):
        for ident in due[key]:
            trace.free(ident)
    return trace


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=stepped_traces(), conf=st.sampled_from([None, "max_split_size_mb:64"]))
def test_steps_that_repeat_probe_as_the_plain_replays(trace, conf):
    assert probe_layout(trace, conf) == probe_layout_plain(trace, conf)


def test_a_replay_jumps_over_steps_that_repeat_and_keeps_the_peak():
    """Steps of the same requests from the same allocator state replay the same: the replay
    skips them, and ends on the peak and the live blocks the full replay has."""
    trace = Trace()
    trace.alloc(30 * MiB, op="parameter")
    grad = None
    for step in range(6):
        activation = trace.alloc(12 * MiB)
        small = trace.alloc(64 * KiB)
        if grad is not None:
            trace.free(grad)
        grad = trace.alloc(30 * MiB, category="gradient")
        trace.free(activation)
        trace.free(small)
        trace.mark(f"step {step + 1}")
    trace.alloc(5 * MiB)  # a tail the steps do not have
    replay = layout_probe._Replay(None, None)
    events = layout_probe._Events.of(trace)
    replay.run(events.kinds, events.ids, events.sizes, events.streams, cuts=events.cuts)
    assert replay.skipped > 0
    assert replay.peak == simulate(trace).peak_reserved_bytes
    assert sorted(replay.live) == sorted(set(trace.live_at(len(trace) - 1)))
    assert probe_layout(trace) == probe_layout_plain(trace)


def test_a_workspace_probe_forks_a_segment_split_into_thousands_of_blocks(monkeypatch):
    """Many small tensors live at the first workspace allocation (a checkpoint's biases and
    norms, an optimizer's fused `step` scalars): the small pool's 2 MiB segment is split into
    thousands of 512-byte blocks linked by prev / next. Forking the replay there copied the
    chain one link per nested deepcopy and passed Python's recursion limit (a RecursionError
    from `peakmem estimate` after nanoGPT's `init_from='resume'`)."""
    trace = Trace()
    scalars = [trace.alloc(4) for _ in range(3000)]
    for ident in scalars[::7]:
        trace.free(ident)
    first = trace.alloc(4 * MiB, op="cublas_workspace[8, 0]")
    trace.alloc(512)  # a freed block of the split segment reused after the fork
    trace.alloc(12 * MiB)
    trace.free(first)
    expected = probe_layout_plain(trace)
    no_plain_replay(monkeypatch)
    assert probe_layout(trace) == expected

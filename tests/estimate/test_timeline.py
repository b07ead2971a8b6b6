"""The memory timeline: steps and phases on the x axis, GiB, categories stacked, the peak."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from peakmem.allocator.simulate import simulate
from peakmem.cli.main import main
from peakmem.estimate.api import estimate_command
from peakmem.estimate.breakdown import PeakBreakdown, rounded
from peakmem.estimate.timeline import write_timeline
from peakmem.estimate.timeline_data import GIB, MAX_POINTS, timeline_data
from peakmem.trace.events import Trace

MIB = 2**20


@pytest.fixture(scope="module")
def example():
    return estimate_command(
        [sys.executable, "-m", "peakmem.examples.mlp_train", "--batch-size", "128",
         "--epochs", "1", "--hidden", "1024"],
        gpu="a100-40gb", isolate=False, timeline=True)


def test_data_of_the_example(example) -> None:
    data = timeline_data(example)
    # title and red line are the same number: the peak reserved
    assert f"peak reserved {example.peak_reserved_bytes / GIB:.2f} GiB" in data.title
    assert data.peak_reserved == example.peak_reserved_bytes == max(data.reserved)
    assert data.peak_allocated == example.peak_allocated_bytes == max(data.allocated)
    phases = {phase for _, _, phase in data.phases}
    assert {"forward", "backward", "optimizer"} <= phases
    assert [label for _, label in data.steps][:3] == ["step 1", "step 2", "step 3"]
    for start, end, _ in data.phases:
        assert 0 <= start <= end < len(example.capture.trace)
    assert list(data.categories)[:2] == ["parameter", "gradient"]  # stacking order
    # the stacked categories add up to the live (rounded) bytes at every point
    live = 0
    sizes = {}
    trace = example.capture.trace
    expected = []
    for kind, ident, size, _s, _t in trace.events():
        if kind == 0:
            sizes[ident] = rounded(size)
            live += sizes[ident]
        elif kind == 1:
            live -= sizes.pop(ident, 0)
        expected.append(live)
    for n, x in enumerate(data.x):
        assert sum(values[n] for values in data.categories.values()) == expected[x]
    label = data.peak_label()
    assert "optimizer_state" in label and "largest module" in label


def test_png(example, tmp_path: Path) -> None:
    path = write_timeline(example, tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_is_interactive_plotly(example, tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    text = write_timeline(example, tmp_path / "t.html").read_text()
    assert "plotly" in text.lower()
    assert f"peak reserved {example.peak_reserved_bytes / GIB:.2f} GiB" in text
    for name in ("optimizer_state", "phase: backward", "step 1", "GiB"):
        assert name in text


def test_html_without_plotly_is_a_static_page(example, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "plotly", None)
    text = write_timeline(example, tmp_path / "t.html").read_text()
    assert "<svg" in text and "red: peak reserved" in text and "step 1" in text
    assert f"peak reserved {example.peak_reserved_bytes / GIB:.2f} GiB" in text


def test_other_extension_refused(example, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.html or \.png"):
        write_timeline(example, tmp_path / "t.svg")


def test_long_trace_is_thinned_keeping_the_peak() -> None:
    trace = Trace()
    trace.mark("forward")
    live = []
    for i in range(30_000):
        live.append(trace.alloc(MIB + (i % 7) * 4096, category="activation"))
        if len(live) > 50:
            trace.free(live.pop(0))
        if i == 20_000:
            spike = trace.alloc(500 * MIB, category="temporary")
            trace.free(spike)
    sim = simulate(trace, timeline=True)
    result = SimpleNamespace(
        capture=SimpleNamespace(trace=trace), simulation=sim,
        peak_reserved_bytes=sim.peak_reserved_bytes, peak_bytes=sim.peak_reserved_bytes,
        context_bytes=0, library_bytes=0, steps=0, gpu=SimpleNamespace(name="h100-80gb"),
        breakdown=PeakBreakdown.at(trace, sim.peak_allocated_index))
    data = timeline_data(result)
    assert len(data.x) <= 2 * MAX_POINTS + 2
    assert max(data.allocated) == sim.peak_allocated_bytes
    assert data.peak_index in data.x
    assert data.phases == [(0, len(trace) - 1, "forward")]


def test_cli_bad_timeline_extension(tmp_path: Path) -> None:
    out = CliRunner().invoke(main, ["estimate", "--timeline", str(tmp_path / "t.txt"), "--",
                                    sys.executable, "-m", "peakmem.examples.mlp_train"])
    assert out.exit_code == 2
    assert "an .html or .png file" in out.stderr


def test_every_category_has_a_stacking_place_and_a_colour_of_its_own() -> None:
    from peakmem.estimate.timeline import CATEGORY_COLOURS
    from peakmem.estimate.timeline_data import CATEGORY_ORDER
    from peakmem.trace.vocab import Category

    names = {category.value for category in Category}
    assert set(CATEGORY_ORDER) == names and len(CATEGORY_ORDER) == len(names)
    assert set(CATEGORY_COLOURS) == names
    assert len(set(CATEGORY_COLOURS.values())) == len(names)
    # collective buffers stack with the training state, below what a step makes and frees
    assert CATEGORY_ORDER.index("communication") < CATEGORY_ORDER.index("activation")

"""The k12 adversarial sweep's regressions (benchmarks/hostile_sweep_k12.py runs the whole sweep):
one test per class of hostile input that broke the contract before its fix. Each docstring says
what went wrong."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from peakmem.capture import capture_callable
from peakmem.capture.torch_function_off import TORCH_FUNCTION_OFF
from peakmem.capture.unsupported import Unsupported
from peakmem.profiles import load_gpu, load_stack

GIB = 1 << 30
MIB = 1 << 20


def _capture(job):
    return capture_callable(job, gpu=load_gpu("a100-40gb"), stack=load_stack("2.4.1"))


# -- device tensors made with peakmem's torch-function mode off (k11's open case) ---------------


def _pop_torch_function_mode():
    from torch.overrides import _pop_mode_temporarily
    return _pop_mode_temporarily()


@pytest.mark.parametrize("modes_off", [torch._C.DisableTorchFunction, _pop_torch_function_mode])
@pytest.mark.parametrize("make", [
    lambda: torch.empty(GIB, dtype=torch.uint8, device="cuda"),  # reaches the recorder
    lambda: torch.ones(4).to("cuda:0"),
    lambda: torch.ones(4).cuda(),  # refused by a device guard before any aten op
    lambda: torch.nn.Linear(4, 4).to("cuda"),
], ids=["empty", "to", "cuda", "module-to"])
def test_a_device_tensor_made_with_the_torch_function_mode_off_is_unsupported(modes_off, make):
    """`with torch._C.DisableTorchFunction(): torch.empty(n, device="cuda")`: the capture's
    mapping of "cuda" to the meta device did not run, and torch's 60-line "Could not run
    'aten::empty.memory_format' with arguments from the 'CUDA' backend" (or "PyTorch is not
    linked with support for cuda devices") was reported as the job's own failure, exit 1. Now:
    `unsupported` (exit 3), one line naming the call."""

    def job():
        with modes_off():
            make()

    result = _capture(job)
    assert isinstance(result.error, Unsupported), result.error_text
    assert result.reason == "unsupported"
    assert result.error_text == f"peakmem does not support {TORCH_FUNCTION_OFF} yet"


def test_ops_on_device_tensors_held_with_the_torch_function_mode_off_are_recorded():
    """The ops on device tensors the job already holds still run there (meta, recorded)."""

    def job():
        x = torch.empty(GIB, dtype=torch.uint8, device="cuda")
        with torch._C.DisableTorchFunction():
            y = x + 1
        return x, y

    result = _capture(job)
    assert result.error is None, result.error_text
    assert result.trace.sizes.count(GIB) == 2


def test_a_jobs_own_not_linked_error_elsewhere_stays_its_own():
    """Only torch's own refusal is translated: the job raising another RuntimeError is its own."""

    def job():
        raise RuntimeError("PyTorch is not linked with support for cuda devices, says the job")

    result = _capture(job)
    assert result.reason == "raised" and not isinstance(result.error, Unsupported)


# -- `peakmem measure`'s table renders the job's strings as they are (k11's open case) ----------


def test_measure_table_prints_markup_in_user_strings_as_it_is():
    """`peakmem measure -- python '[/x].py'` (or an error, a snapshot path, an allocator config
    with brackets) printed the table through rich markup: MarkupError (`peakmem internal error`,
    exit 70) after the job had run on the GPU, or `[bold]` restyled away. Line breaks in an error
    could forge rows. Now every user string is one line of plain text."""
    from peakmem.cli.measure import measure_table
    from peakmem.measure.result import MeasureResult, MeasureStatus

    result = MeasureResult(
        peak_bytes=GIB, peak_reserved_bytes=GIB, peak_allocated_bytes=GIB, context_bytes=MIB,
        status=MeasureStatus.OK, gpu="NVIDIA H200", driver="1", cuda="12", torch="2.5",
        alloc_conf="[bold]expandable_segments:True[/bold]", seconds=1.0, steps=3,
        steps_requested=3, job="python [/x].py --name [red]a[/red]",
        error="boom\nstatus  ok", snapshot="snap[/]s.pickle")
    console = Console(file=io.StringIO(), width=300, color_system=None)
    console.print(measure_table(result))
    out = console.file.getvalue()
    assert "peakmem measure: python [/x].py --name [red]a[/red]" in out
    assert "[bold]expandable_segments:True[/bold]" in out
    assert "snap[/]s.pickle" in out
    assert "(boom\\nstatus  ok)" in out
    assert not any(line.strip("│ ").startswith("status  ok") for line in out.splitlines())


# -- `estimate --timeline PATH` printed the path as markup -----------------------------------------


@pytest.mark.parametrize("name", ["t[/x].html", "t[bold].html"])
def test_estimate_prints_a_timeline_path_that_is_markup_as_it_is(tmp_path, monkeypatch, name):
    """`peakmem estimate --timeline 't[/x].html' train.py` (text report): the closing line
    printed the path through rich markup: MarkupError, `peakmem internal error` (exit 70) after
    the estimate and the timeline were made (in the folder `t[`); `t[bold].html` printed as
    `t.html`, a file that is not there. Now the path is printed as it is."""
    from types import SimpleNamespace

    from click.testing import CliRunner

    import peakmem.estimate
    import peakmem.estimate.report
    import peakmem.estimate.timeline
    from peakmem.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    (tmp_path / "t[").mkdir()
    monkeypatch.setattr(peakmem.estimate, "estimate_command", lambda *a, **k: SimpleNamespace(notes=[]))
    monkeypatch.setattr(peakmem.estimate.timeline, "write_timeline", lambda result, path: None)
    monkeypatch.setattr(peakmem.estimate.report, "render", lambda *a, **k: None)
    result = CliRunner().invoke(main, ["estimate", "--timeline", name, "train.py"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("timeline written to ")
    assert result.output.rstrip().endswith(f"{tmp_path.name}/{name}")  # the absolute path


# -- as_strided views past their storage ----------------------------------------------------------


@pytest.mark.parametrize("size, stride, offset, needed", [
    ((1_000_000,), (1,), 0, 4_000_000),
    ((5,), (1,), 6, 44),
    ((4, 4), (4, 1), 0, 64),
])
def test_an_as_strided_view_past_its_storage_fails_as_on_the_gpu(size, stride, offset, needed):
    """`x.as_strided((10**6,), (1,))` of a 10-element device tensor: CUDA's kernel refuses a view
    past the storage, the meta kernel checks nothing, so the job ran on and got an estimate with
    exit 0 where it fails on the GPU. Now torch's own error, word for word as the CPU says it."""
    seen = []

    def job():
        x = torch.empty(10, device="cuda")
        try:
            x.as_strided(size, stride, offset)
        except RuntimeError as exc:
            seen.append(str(exc))
        host = torch.empty(10)
        try:
            host.as_strided(size, stride, offset)
        except RuntimeError as exc:
            seen.append(str(exc))

    result = _capture(job)
    assert result.error is None, result.error_text
    assert len(seen) == 2 and seen[0] == seen[1]
    assert f"requiring a storage size of {needed} are out of bounds for storage of size 40" in seen[0]


def test_as_strided_views_inside_their_storage_run_as_before():
    def job():
        x = torch.empty(4 * MIB, device="cuda")
        views = [x.as_strided((2 * MIB,), (2,), 1), x.as_strided((0,), (1,), 1 << 40),
                 x.as_strided((1024, 4096), (4096, 1)), x.as_strided((4 * MIB,), (1,))]
        return [v + 1 for v in views]

    result = _capture(job)
    assert result.error is None, result.error_text
    assert 16 * MIB in result.trace.sizes and 8 * MIB in result.trace.sizes


# -- GPU names that are long, multi-line or bidi ---------------------------------------------------


def test_an_unknown_gpu_name_of_10_kb_is_shown_cut_with_the_known_list():
    """`--gpu` of 10 000 characters: the error echoed the whole name, so the one-line message
    (cut at 2000 characters) lost the list of known GPUs. Now 80 characters of the name and the
    list; line breaks and a bidi override in the name are escaped."""
    from peakmem.profiles import ProfileError

    with pytest.raises(ProfileError) as long_name:
        load_gpu("h" * 10_000)
    message = str(long_name.value)
    assert message.startswith("unknown GPU '" + "h" * 77 + "...'; known GPUs: ")
    assert "h200" in message and len(message) < 400
    with pytest.raises(ProfileError) as odd_name:
        load_gpu("h200\u202e\n[/x]")
    assert "\n" not in str(odd_name.value) and "\u202e" not in str(odd_name.value)

"""CUDA-event timings of compiled code under the capture (capture/compiled_timing.py) and the
OptimizedModule stand-in (`compiled_code.compiled_view`): pytorch/tutorials'
torch_compile_tutorial times `model(x)` against `torch.compile(model)(x)` and asserts the
compiled median is lower, before it trains; both ran eagerly and timed alike, and the job failed
about half of the time with no estimate."""

import time

import torch

from peakmem.capture import capture_callable
from peakmem.capture.compiled_timing import NOTE, CompiledClock, elapsed_ms

SLEEP = 0.02


def _spin(seconds: float) -> None:
    """Busy the process's CPU for `seconds` of CPU time (the events' clock)."""
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


class Sleepy(torch.nn.Module):
    """A forward of known host CPU time."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        _spin(SLEEP)
        return self.linear(x)


def _timed(fn) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _compile_notes(result) -> list[str]:
    return [note for note in result.notes if note.startswith("torch.compile was not applied")]


def test_compiled_module_times_faster_than_the_same_module_eager(a100, stack24):
    times: dict[str, list[float]] = {"eager": [], "compiled": []}

    def job():
        model = Sleepy().cuda()
        model_opt = torch.compile(model, mode="reduce-overhead")
        x = torch.randn(4, 8, device="cuda")
        with torch.no_grad():
            for _ in range(3):
                times["eager"].append(_timed(lambda: model(x)))
            for _ in range(3):
                times["compiled"].append(_timed(lambda: model_opt(x)))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    eager, compiled = sorted(times["eager"])[1], sorted(times["compiled"])[1]
    assert eager >= SLEEP * 1000  # the host's CPU milliseconds, as before
    assert compiled < 0.75 * eager, times  # half the compiled region's host time counts
    assert NOTE in result.notes


def test_module_called_directly_after_compile_stays_eager(a100, stack24):
    seen = {}

    def job():
        model = Sleepy().cuda()
        model_opt = torch.compile(model)
        seen["orig"] = model_opt._orig_mod is model
        seen["shared"] = model_opt.linear is model.linear
        # OptimizedModule's keys: the module's under `_orig_mod.`
        seen["keys"] = list(model_opt.state_dict()) == [f"_orig_mod.{key}"
                                                        for key in model.state_dict()]
        x = torch.randn(4, 8, device="cuda")
        model(x).sum().backward()  # the module itself, not its compiled view
        seen["eager_ms"] = _timed(lambda: model(x))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen["orig"] and seen["shared"] and seen["keys"]
    assert _compile_notes(result) == []  # no compiled code ran
    assert seen["eager_ms"] >= SLEEP * 1000 and NOTE not in result.notes


def test_compiled_view_moves_with_its_module(a100, stack24):
    """Parameters replaced through the view (`.to()`, `.half()`) are the module's too."""
    seen = {}

    def job():
        model = torch.nn.Sequential(torch.nn.Linear(8, 8))
        model_opt = torch.compile(model).cuda().half()
        seen["device"] = model[0].weight.device.type
        seen["dtype"] = model[0].weight.dtype
        model_opt(torch.randn(4, 8, device="cuda", dtype=torch.half)).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"device": "cuda", "dtype": torch.half}
    assert len(_compile_notes(result)) == 1


def test_clock_counts_nested_regions_once():
    clock = CompiledClock()
    clock.enter()
    clock.enter()
    _spin(0.01)
    clock.leave()
    assert clock.depth == 1 and clock.spent == 0.0  # still inside the outer region
    clock.leave()
    clock.leave()  # unbalanced: ignored
    assert 0.01 <= clock.spent < 0.5 and clock.depth == 0
    assert clock.seconds() == clock.spent


def test_elapsed_discounts_only_compiled_time():
    assert elapsed_ms((0.0, 0.0), (1.0, 0.0)) == (1000.0, False)
    assert elapsed_ms((0.0, 2.0), (1.0, 3.0)) == (500.0, True)
    assert elapsed_ms((1.0, 0.0), (1.0, 0.0))[0] > 0  # never zero: jobs divide by it


def test_waiting_is_not_counted_only_work(a100, stack24):
    """A GPU event times the work between its records, not the host's waits; and a loaded
    machine's preemption must not make a timed region look slower (the tutorial's CI failure):
    the clock is CPU time, so a sleep between the records adds (almost) nothing."""
    seen = {}

    def job():
        seen["slept"] = _timed(lambda: time.sleep(0.2))
        seen["worked"] = _timed(lambda: _spin(0.05))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen["slept"] < 50, seen  # wall clock: >= 200 ms
    assert seen["worked"] >= 50, seen

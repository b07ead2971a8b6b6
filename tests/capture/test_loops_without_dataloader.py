"""The default step policy ends a training loop that does not iterate a DataLoader
(capture/loop_ends.py): the code after it runs, with the next loop given its own limit; where it
cannot be ended the job is stopped and the note says the estimate may be low.

Each job is a small script (its own file: loops are ended only in the job's own code). The
bytes are worked out from the shapes: fp32 tensors, blocks rounded to 512 bytes (2 MiB segments
do not enter: the figures are allocated bytes)."""

import runpy
import sys
import textwrap

import pytest

from peakmem.capture import frame_moves, loop_ends
from peakmem.capture.loop_exits import enclosing, loops_of
from peakmem.estimate import estimate, estimate_command

KiB = 1024
MiB = 1024 * KiB

verified_python = pytest.mark.skipif(
    sys.version_info[:2] not in loop_ends.VERIFIED_PYTHONS,
    reason="loops are ended only on the CPython versions capture/loop_exits.py was verified on")


def write(tmp_path, body, name="job.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


class Run:
    """An estimate's figures and its capture's (peak_allocated: the simulated allocator's
    peak of allocated bytes)."""

    def __init__(self, est):
        self.peak_allocated = est.peak_allocated_bytes
        self.steps = est.steps
        self.stopped = est.capture.stopped
        self.notes = est.capture.notes
        self.trace = est.capture.trace
        self.workspace = est.breakdown.by_category.get("workspace", 0)


def run(tmp_path, body, a100, stack24, **kwargs):
    """The script run in this process (`runpy`: its frames are the job's own code, a file of
    its own), estimated for an A100 with torch 2.4."""
    path = write(tmp_path, body)
    est = estimate(runpy.run_path, path, run_name="__main__", gpu="a100-40gb",
                   torch_version="2.4.1", **kwargs)
    assert est.capture is not None and est.capture.error is None, est.capture.error_text
    return Run(est)


def run_command(tmp_path, body):
    """The script as a command (`python job.py`: its module frame is the job's outermost)."""
    est = estimate_command(["python", write(tmp_path, body)], gpu="a100-40gb",
                           torch_version="2.4.1")
    assert est.capture is not None and est.capture.error is None, est.capture.error_text
    return Run(est)


def output(capfd):
    out, err = capfd.readouterr()
    return out + err


def ended_notes(result):
    return [n for n in result.notes if n.startswith("ended ")]


def stop_notes(result):
    return [n for n in result.notes if n.startswith("stopped after")]


def fp32(*shape):
    size = 4
    for n in shape:
        size *= n
    return -(-size // 512) * 512


# Two training loops in a row: the second trains a much wider model. Stopping the job in the
# first loop missed the second's peak; with the loops ended, each gets 3 steps.
TWO_LOOPS = """
    import torch
    data = [torch.randn(64, 256, device="cuda") for _ in range(6)]
    small = torch.nn.Linear(256, 256, bias=False).cuda()
    opt = torch.optim.SGD(small.parameters(), lr=0.1)
    for epoch in range(2):
        for x in data:
            small(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    print("first loop done at epoch", epoch)
    wide = torch.nn.Linear(256, 8192, bias=False).cuda()
    opt2 = torch.optim.SGD(wide.parameters(), lr=0.1)
    for x in data:
        wide(x).sum().backward()
        opt2.step()
        opt2.zero_grad(set_to_none=True)
    print("second loop done")
"""


@verified_python
def test_two_loops_each_get_their_steps_and_the_later_peak_is_seen(tmp_path, a100, stack24,
                                                                    capfd):
    result = run(tmp_path, TWO_LOOPS, a100, stack24)
    out = output(capfd)
    full = run(tmp_path, TWO_LOOPS, a100, stack24, steps="all")
    assert "first loop done at epoch 0" in out and "second loop done" in out
    assert not result.stopped and result.steps == 3  # 3 steps of each optimizer
    assert full.steps == 12  # 2 epochs of 6; the wide loop's optimizer 6
    (note,) = ended_notes(result)
    assert note.startswith("ended 2 training loop(s) without a DataLoader at the step limit "
                           "(job.py:7, job.py:14)")
    # the peak is the wide loop's backward: the data (6 x (64, 256)), both weights, the wide
    # weight's gradient, the (64, 8192) output and its gradient (sum's backward expands a
    # 0-d ones), the small weight's (freed by set_to_none) no longer; the same in the full run
    data = 6 * fp32(64, 256)
    weights = fp32(256, 256) + fp32(8192, 256)
    assert result.peak_allocated >= data + weights + fp32(8192, 256)
    assert result.peak_allocated == full.peak_allocated
    # stopping in the first loop (as before) saw the small model only
    stopped = run(tmp_path, TWO_LOOPS, a100, stack24, steps=3)
    # ... which missed at least the wide weight, its output and the output's gradient
    assert result.peak_allocated - stopped.peak_allocated >= (fp32(8192, 256)
                                                              + 2 * fp32(64, 8192))


# A loop over a step count, then an evaluation on a batch 32 times larger (no DataLoader).
LOOP_THEN_EVAL = """
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(128, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())
    def train_step():
        x = torch.randn(32, 128, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for step in range(1000):
        train_step()
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(1024, 128, device="cuda"))
        hidden = model[0](torch.randn(1024, 128, device="cuda"))
    print("evaluated after step", step)
"""


@verified_python
def test_a_loop_then_an_evaluation_runs_the_evaluation(tmp_path, a100, stack24, capfd):
    result = run(tmp_path, LOOP_THEN_EVAL, a100, stack24)
    assert "evaluated after step 2" in output(capfd)
    assert not result.stopped and result.steps == 3
    assert "eval" in result.trace.meta["phases_ran"]
    (note,) = ended_notes(result)
    assert "(job.py:11)" in note
    # the evaluation's peak: parameters and Adam's two moments, the (1024, 10) output kept
    # alive, then model[0]'s input (1024, 128) and its (1024, 1024) output
    params = fp32(1024, 128) + fp32(1024) + fp32(10, 1024) + fp32(10)
    assert result.peak_allocated >= 3 * params + fp32(1024, 1024) + fp32(1024, 128)
    full = run(tmp_path, LOOP_THEN_EVAL, a100, stack24, steps="all")
    assert full.steps == 1000 and full.peak_allocated == result.peak_allocated


# nanoGPT's shape: `while True` with the job's own counter and a `break`, then code after it.
WHILE_LOOP = """
    import torch
    model = torch.nn.Linear(64, 64).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    iter_num, max_iters = 0, 5000
    while True:
        X = torch.randn(16, 64, device="cuda")
        model(X).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num > max_iters:
            break
    after = torch.empty(4 * 1024 * 1024, device="cuda")  # 16 MiB after the loop
    print("after the loop at", iter_num)
"""


@verified_python
def test_a_while_loop_with_a_counter_is_ended_and_its_counter_kept(tmp_path, a100, stack24,
                                                                   capfd):
    result = run(tmp_path, WHILE_LOOP, a100, stack24)
    assert "after the loop at 3" in output(capfd)
    assert not result.stopped and result.steps == 3
    assert len(ended_notes(result)) == 1
    # the 16 MiB made after the loop is the peak: the last batch `X` (16, 64), weight, bias
    # and AdamW's two moments of each besides it (the gradients were set to None), and
    # cuBLAS's workspaces
    params = fp32(64, 64) + fp32(64)
    assert result.peak_allocated == (16 * MiB + fp32(16, 64) + 3 * params
                                     + result.workspace)


# The batches come from a generator the loop iterates (`enumerate` over it); after the loop a
# wider model's forward and backward on one more batch from a fresh generator.
GENERATOR_LOOP = """
    import torch
    def batches(n):
        for _ in range(n):
            yield torch.randn(32, 512, device="cuda")
    model = torch.nn.Linear(512, 512, bias=False).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for i, x in enumerate(batches(10_000)):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    big = torch.nn.Linear(512, 8192, bias=False).cuda()
    big(next(batches(1))).sum().backward()
    print("after the generator loop at", i)
"""


@verified_python
def test_a_generator_loop_is_ended_and_the_code_after_it_runs(tmp_path, a100, stack24, capfd):
    result = run(tmp_path, GENERATOR_LOOP, a100, stack24)
    assert "after the generator loop at 2" in output(capfd)
    assert len(ended_notes(result)) == 1 and result.steps == 3 and not result.stopped
    # at the wide backward: the small weight and its momentum, `x` (the loop's last batch,
    # still bound), the wide weight, its gradient, the (32, 8192) output's gradient
    small = fp32(512, 512)
    assert result.peak_allocated >= 2 * small + fp32(32, 512) + 2 * fp32(8192, 512)
    full = run(tmp_path, GENERATOR_LOOP.replace("10_000", "40"), a100, stack24, steps="all")
    assert full.steps == 40 and full.peak_allocated == result.peak_allocated


LAST_LOOP = """
    import torch
    def batches():
        while True:
            yield torch.randn(32, 512, device="cuda")
    def main():
        model = torch.nn.Linear(512, 512).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in batches():
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    if __name__ == "__main__":
        main()
"""


@verified_python
def test_the_scripts_last_loop_is_stopped_and_the_note_says_nothing_follows(
        tmp_path, a100, stack24):
    result = run_command(tmp_path, LAST_LOOP)
    assert result.stopped and result.steps == 3
    assert stop_notes(result) == [
        "stopped after 3 optimizer steps (its training loop does not iterate a DataLoader; it "
        "is the last statement of the script, so nothing after it was missed); its remaining "
        "iterations did not run; --steps all runs it to the end"
    ]


# A loop that is the last statement of a function, called before an evaluation: its exit is
# the implicit `return None`, which no line leads to; the loop's iterator is exhausted at its
# head instead (capture/frame_moves.py) and the evaluation runs. Where frames cannot be moved
# so, the job is stopped and the note says the estimate may be low and how to check.
LOOP_AT_FUNCTION_END = """
    import torch
    model = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def train():
        for step in range(100):
            model(torch.randn(8, 64, device="cuda")).sum().backward()
            opt.step()
    train()
    with torch.no_grad():
        model(torch.randn(100_000, 64, device="cuda"))
"""


@verified_python
def test_a_loop_at_its_functions_end_is_ended_and_the_evaluation_runs(tmp_path, a100, stack24):
    result = run(tmp_path, LOOP_AT_FUNCTION_END, a100, stack24)
    assert not result.stopped and result.steps == 3
    (note,) = ended_notes(result)
    assert "(job.py:6)" in note
    # the evaluation's (100000, 64) input and output, with the weight, bias and gradients
    assert result.peak_allocated >= 2 * fp32(100_000, 64)
    full = run(tmp_path, LOOP_AT_FUNCTION_END, a100, stack24, steps="all")
    assert full.steps == 100 and full.peak_allocated == result.peak_allocated


def test_a_loop_that_cannot_be_ended_says_the_estimate_may_be_low(tmp_path, a100, stack24,
                                                                 monkeypatch):
    monkeypatch.setattr(frame_moves, "supported", lambda: False)
    result = run(tmp_path, LOOP_AT_FUNCTION_END, a100, stack24)
    assert result.stopped and result.steps == 3
    (note,) = stop_notes(result)
    assert note.startswith(
        "stopped after 3 optimizer steps (its training loop does not iterate a DataLoader and "
        "could not be ended early: its loop at job.py:6 has no exit a running frame can jump to"
    )
    assert "the estimate may be low if that reaches a higher peak; --steps all runs it to the " \
           "end (and checks it)" in note
    assert not ended_notes(result)


# -- the bytecode reading ----------------------------------------------------------------------

def _sample(data):
    total = 0
    for _epoch in range(3):
        for x in data:
            total += x
        total -= 1
    while total < 100:
        total += 1
    for last in data:
        total += last


@verified_python
def test_loops_and_their_exits_are_read_from_the_bytecode():
    loops = loops_of(_sample.__code__)
    first = _sample.__code__.co_firstlineno
    assert [loop.is_for for loop in loops] == [True, True, False, True]
    epoch, inner, while_loop, last = loops
    # the inner loop exits to `total -= 1`, the epoch loop to the `while`, the while loop to
    # the last `for`; the last loop exits into the implicit return: no line to jump to
    assert inner.exit_line == first + 5 and epoch.exit_line == first + 6
    assert while_loop.exit_line == first + 8
    assert last.exit_line is None and last.ends_code
    assert not epoch.ends_code
    assert enclosing(_sample.__code__, inner.start + 2) == [epoch, inner]


def _loop_then_with(data, lock):
    for _epoch in range(3):
        for x in data:
            print(x)
    with lock:
        print("after")


@verified_python
def test_a_with_statement_after_the_loop_is_no_usable_exit():
    # the `with` line also starts its `__exit__` call, with the manager on the stack: from the
    # loop's head (its iterator on the stack) CPython would pick that instruction and call the
    # iterator, so neither loop may jump there (the job is stopped instead)
    epoch, inner = loops_of(_loop_then_with.__code__)
    assert epoch.exit_line is None and inner.exit_line is None
    assert not epoch.ends_code


@pytest.mark.parametrize("shape", [TWO_LOOPS])
def test_an_explicit_step_limit_still_stops_the_job(tmp_path, a100, stack24, shape):
    result = run(tmp_path, shape, a100, stack24, steps=5)
    assert result.stopped and result.steps == 5 and not ended_notes(result)


def test_an_unverified_python_stops_the_job_and_says_why(tmp_path, a100, stack24, monkeypatch):
    """On a CPython whose bytecode loop_exits.py was not verified against, no frame is jumped:
    the job is stopped at the limit as before and the note says the estimate may be low."""
    monkeypatch.setattr(loop_ends, "VERIFIED_PYTHONS", frozenset())
    result = run(tmp_path, TWO_LOOPS, a100, stack24)
    assert result.stopped and result.steps == 3
    (note,) = stop_notes(result)
    assert "loops are ended only on CPython" in note
    assert "the estimate may be low" in note
    assert not ended_notes(result)

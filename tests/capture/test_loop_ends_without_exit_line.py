"""Loops whose exit no line leads to are ended too (capture/frame_moves.py): a `for` loop's
iterator is exhausted at its head, a `while` loop is sent to its exit, so the code after the loop
runs where stopping the job would miss it.

Each job trains a Linear(64, 64) with plain SGD (no optimizer state) for N steps, then allocates
16 MiB after the loop (in a function the caller goes on to, after a `with`, a `finally:`, ...).
The loop allocates far less (the 64x64 weight, its gradient, (8, 64) batches): a job stopped at
the step limit peaks below 1 MiB besides cuBLAS's workspace, so each estimate below is at least 16 MiB only because the
code after the loop ran. The default run (N = 1000, ended after 3 steps) is compared, to the
byte, with `--steps all` on N = 6 (the same state when the loop is over)."""

import runpy
import sys
import textwrap

import pytest

from peakmem.capture import frame_moves, loop_ends
from peakmem.capture.loop_exits import loops_of, return_none
from peakmem.estimate import estimate

MiB = 1024 * 1024

verified_python = pytest.mark.skipif(
    sys.version_info[:2] not in loop_ends.VERIFIED_PYTHONS or not frame_moves.supported(),
    reason="loops are moved only on the CPython versions frame_moves.py was written for")

PRELUDE = """
    import torch
    model = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def train_step(x=None):
        x = torch.randn(8, 64, device="cuda") if x is None else x
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    def evaluate():
        big = torch.empty(4 * MiB, device="cuda")  # 16 MiB of fp32
        print("evaluated after", STEP, big.numel())
"""

PARAMS = 64 * 64 * 4 + 512  # weight, bias (256 bytes, one 512-byte block)
BATCHES = 4 * 8 * 64 * 4  # four (8, 64) fp32 batches kept by the job

# name -> (the job after the prelude, bytes the job holds at the 16 MiB besides the parameters,
# what its output must show)
SHAPES = {
    # 1. the loop is the last statement of `train()`; the caller goes on to evaluate
    "last_statement_of_function": ("""
        def train():
            for step in range(N):
                train_step()
        train()
        STEP = "train"
        evaluate()
    """, 0, ["evaluated after train"]),
    # 2. a `with` right after the loop; a loop inside a `with` (its exit is the `with`'s)
    "with_after_loop": ("""
        for step in range(N):
            train_step()
        with torch.no_grad():
            STEP = step
            evaluate()
    """, 0, ["evaluated after 2"]),
    "loop_inside_with": ("""
        class Scope:
            def __enter__(self):
                print("entered")
            def __exit__(self, kind, value, tb):
                print("left with", kind)
        def train():
            with Scope():
                for step in range(N):
                    train_step()
        train()
        STEP = "with"
        evaluate()
    """, 0, ["entered", "left with None", "evaluated after with"]),
    # 3. `try: ... finally:` around the loop; `try: ... except KeyboardInterrupt:` around it
    "try_finally": ("""
        def train():
            try:
                for step in range(N):
                    train_step()
            finally:
                print("cleanup ran")
        train()
        STEP = "finally"
        evaluate()
    """, 0, ["cleanup ran", "evaluated after finally"]),
    "except_keyboard_interrupt": ("""
        def train():
            try:
                for step in range(N):
                    train_step()
            except KeyboardInterrupt:
                print("interrupted")
        train()
        STEP = "ctrl-c"
        evaluate()
    """, 0, ["evaluated after ctrl-c"]),
    # 4. `while True:` with a counter's `break`, last in its function
    "while_true_break": ("""
        def train():
            it = 0
            while True:
                train_step()
                it += 1
                if it >= N:
                    break
        train()
        STEP = "while"
        evaluate()
    """, 0, ["evaluated after while"]),
    # `main()` calls `train()` (the loop last in it) then evaluates
    "called_from_main": ("""
        def train():
            for step in range(N):
                train_step()
        def main():
            train()
            global STEP
            STEP = "main"
            evaluate()
        if __name__ == "__main__":
            main()
    """, 0, ["evaluated after main"]),
    # epochs x batches (a list, no DataLoader), both loops last in `train()`
    "nested_epochs_batches": ("""
        batches = [torch.randn(8, 64, device="cuda") for _ in range(4)]
        def train():
            for epoch in range(N):
                for x in batches:
                    train_step(x)
        train()
        STEP = "epochs"
        evaluate()
    """, BATCHES, ["evaluated after epochs"]),
    # the loop in `if __name__ == "__main__":`, code after it in the block
    "main_block": ("""
        if __name__ == "__main__":
            for step in range(N):
                train_step()
            STEP = step
            evaluate()
    """, 0, ["evaluated after 2"]),
    # a Trainer whose `fit()` calls its epoch method (the loop last in it), then evaluates
    "trainer_method": ("""
        class Trainer:
            def __init__(self):
                self.batches = [torch.randn(8, 64, device="cuda") for _ in range(4)]
            def train_epoch(self):
                for x in self.batches:
                    train_step(x)
            def fit(self, epochs):
                for epoch in range(epochs):
                    self.train_epoch()
                global STEP
                STEP = "fit"
                evaluate()
        Trainer().fit(N)
    """, BATCHES, ["evaluated after fit"]),
}


def job(body, n):
    return textwrap.dedent(PRELUDE) + f"MiB = {MiB}\nN = {n}\n" + textwrap.dedent(body)


def run(tmp_path, text, **kwargs):
    path = tmp_path / "job.py"
    path.write_text(text)
    est = estimate(runpy.run_path, str(path), run_name="__main__", gpu="a100-40gb",
                   torch_version="2.4.1", **kwargs)
    assert est.capture is not None and est.capture.error is None, est.capture.error_text
    return est


@verified_python
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_loop_is_ended_and_the_code_after_it_runs(tmp_path, capfd, shape):
    body, held, shown = SHAPES[shape]
    default = run(tmp_path, job(body, 1000))
    out = capfd.readouterr().out
    for text in shown:
        assert out.count(text) == 1, (text, out)
    assert not default.capture.stopped
    assert [n for n in default.capture.notes if n.startswith("ended ")]
    assert not [n for n in default.capture.notes if "may be low" in n]
    # the peak is the 16 MiB, with the parameters, what the job holds and cuBLAS's workspace
    workspace = default.breakdown.by_category.get("workspace", 0)
    assert default.peak_allocated_bytes == 16 * MiB + PARAMS + held + workspace
    full = run(tmp_path, job(body, 6), steps="all")
    assert full.peak_allocated_bytes == default.peak_allocated_bytes


@verified_python
def test_the_exhausted_iterator_is_released_as_a_break_releases_it(tmp_path, capfd):
    """A generator the ended loop iterated is closed (its `finally:` runs) when the loop drops
    it, before the code after the loop, as after a `break`."""
    body = """
        def batches():
            try:
                while True:
                    yield torch.randn(8, 64, device="cuda")
            finally:
                print("generator closed")
        def train():
            for x in batches():
                train_step(x)
        train()
        STEP = "generator"
        evaluate()
    """
    default = run(tmp_path, job(body, 0))
    out = capfd.readouterr().out
    assert out.index("generator closed") < out.index("evaluated after generator")
    assert not default.capture.stopped and default.steps == 3


def test_without_frame_moves_the_job_is_stopped_with_the_may_be_low_note(tmp_path, monkeypatch):
    """Where frames cannot be moved (another CPython, another layout), a loop no line leads out
    of is not ended: the job is stopped at the limit and the note says the estimate may be low."""
    monkeypatch.setattr(frame_moves, "supported", lambda: False)
    est = run(tmp_path, job(SHAPES["last_statement_of_function"][0], 1000))
    assert est.capture.stopped and est.steps == 3
    (note,) = [n for n in est.capture.notes if n.startswith("stopped after")]
    assert "has no exit a running frame can jump to" in note
    assert "the estimate may be low" in note
    # the 16 MiB after the loop was missed: the parameters, a gradient, a batch and its output
    # besides cuBLAS's workspace
    workspace = est.breakdown.by_category.get("workspace", 0)
    assert est.peak_allocated_bytes - workspace < 1 * MiB


# -- which move each loop gets (read from the bytecode) ------------------------------------------

def _for_then_with(data, lock):
    for x in data:
        print(x)
    with lock:
        pass


def _while_true_last(n):
    i = 0
    while True:
        i += 1
        if i > n:
            break


def _while_true_in_with(n, lock):
    with lock:
        while True:
            n += 1
            if n > 5:
                break


async def _async_for(items):
    async for x in items:
        print(x)


@verified_python
def test_each_loop_gets_the_move_its_bytecode_allows():
    def moves(function):
        code = function.__code__
        planned = loop_ends._exits(code, list(loops_of(code)))
        return None if planned is None else [exit.how for exit in planned.values()]

    assert moves(_for_then_with) == ["exhaust"]
    # the `break` became a `return None` inside the loop: the frame is sent there
    (loop,) = loops_of(_while_true_last.__code__)
    assert loop.exit is None and moves(_while_true_last) == ["goto"]
    # inside a `with` the loop has an exit of its own (the `with`'s exit code): sent there, never
    # to a `return None` that would skip `__exit__`
    (loop,) = loops_of(_while_true_in_with.__code__)
    assert return_none(_while_true_in_with.__code__, loop.start) is None
    assert moves(_while_true_in_with) == ["goto"]
    # an `async for` loop's exit is its StopAsyncIteration handler: no move
    assert moves(_async_for) is None


def _counted(n, seen):
    for i in range(n):
        seen.append(i)
    else:
        seen.append("else")


def _counted_while(n, seen):
    i = 0
    while i < n:
        seen.append(i)
        i += 1
    with open(__file__):
        seen.append("after")


@verified_python
@pytest.mark.parametrize("function, move", [(_counted, "exhaust"), (_counted_while, "goto")])
def test_a_move_at_the_loops_head_ends_it_there(function, move):
    """The moves themselves, from a `line` event at the loop's third arrival at its head: the
    loop stops there and what follows it (a `for` loop's `else:`, a
    `with`) runs once; anywhere but at the head the move refuses and changes nothing."""
    code = function.__code__
    (loop,) = loops_of(code)
    arrivals, results = [], []

    def local(frame, event, arg):
        if event == "line" and frame.f_lasti == loop.start:
            arrivals.append(frame.f_lasti)
            if len(arrivals) == 3:
                results.append(frame_moves.exhaust(frame, loop.start + 2))  # not the head
                results.append(frame_moves.exhaust(frame, loop.start) if move == "exhaust"
                               else frame_moves.goto(frame, loop.start, loop.exit))
        return local

    def calls(frame, event, arg):
        return local if frame.f_code is code else None

    seen, previous = [], sys.gettrace()
    sys.settrace(calls)
    try:
        function(1000, seen)
    finally:
        sys.settrace(previous)
    assert results == [False, True]
    # a `for` loop's head is arrived at from its end only (its first `FOR_ITER` starts no line):
    # 3 iterations ran; a `while` body's first line is arrived at on the way in too: 2 ran
    if move == "exhaust":
        assert seen == [0, 1, 2, "else"]
    else:
        assert seen == [0, 1, "after"]

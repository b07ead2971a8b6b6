"""The job's atexit handlers run when its script ends, inside the capture (jobs/exit_handlers.py):
their device allocations count, as they do on a GPU."""

from __future__ import annotations

import atexit
import functools
import json
import os
from pathlib import Path

import pytest

from peakmem.estimate import EstimateError, estimate_command
from peakmem.jobs.exit_handlers import ended_normally, is_job_code, job_exit_handlers

GIB = 2**30

JOB = """\
import atexit, sys, torch
model = torch.nn.Linear(64, 64).cuda()
held = []

def save(gib):
    held.append(torch.empty(gib * 2**28, device="cuda"))  # GIB GiB of float32 at exit
    print("saved", file=sys.stderr)

def broken():
    raise RuntimeError("a broken exit handler")

def never():
    held.append(torch.empty(8 * 2**28, device="cuda"))

atexit.register(save, 1)
atexit.register(broken)  # printed and ignored, as the interpreter does
atexit.register(never)
atexit.unregister(never)
model(torch.randn(4, 64, device="cuda")).sum().backward()
if sys.argv[1:] == ["exit0"]:
    sys.exit(0)
if sys.argv[1:] == ["fail"]:
    raise ValueError("the job failed")
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def test_exit_handlers_run_in_order_and_survive_errors(capsys):
    seen: list[str] = []

    def note(word: str) -> None:
        seen.append(word)

    with job_exit_handlers() as handlers:
        atexit.register(note, "first")
        atexit.register(lambda: 1 / 0)
        atexit.register(functools.partial(note, "last"))
        atexit.register(os.getpid)  # a library's (builtin): left to the real atexit
        atexit.unregister(os.getpid)
        assert handlers.run() == 3
        atexit.register(note, "dropped")
    assert seen == ["last", "first"]
    assert not is_job_code(os.getpid) and not is_job_code(json.dumps) and is_job_code(note)
    err = capsys.readouterr().err
    assert "Exception ignored in atexit callback" in err and "ZeroDivisionError" in err
    assert "peakmem/jobs/exit_handlers.py" not in err  # the job's frames only
    assert atexit.register is not handlers.register  # the real one is back


@pytest.mark.parametrize("args", [[], ["exit0"]])
def test_an_allocation_in_an_exit_handler_counts(script, args):
    result = estimate_command(["python", str(script), *args], gpu="a100-40gb", mode="fake",
                              timeout=120)
    assert GIB <= result.peak_allocated_bytes < 2 * GIB


def test_exit_handlers_do_not_run_after_the_job_failed(script):
    with pytest.raises(EstimateError) as failed:
        estimate_command(["python", str(script), "fail"], gpu="a100-40gb", mode="fake",
                         timeout=120, isolate=False)
    assert "the job failed" in failed.value.message


def test_ended_normally():
    class Hostile(int):
        def __eq__(self, other):
            raise RuntimeError("no comparing")

        __hash__ = int.__hash__

    assert ended_normally(None) and ended_normally(SystemExit()) and ended_normally(SystemExit(0))
    assert ended_normally(SystemExit(False)) and ended_normally(SystemExit(Hostile(0)))
    assert not ended_normally(SystemExit(Hostile(3))) and not ended_normally(SystemExit("bye"))
    assert not ended_normally(ValueError())

"""The k10 adversarial sweep's regressions (benchmarks/hostile_sweep_k10.py runs the whole sweep):
one test per class of hostile input that broke the contract before its fix. Each docstring says
what went wrong."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from peakmem.capture import spawned_children
from peakmem.capture.loop_ends import LoopEnds
from peakmem.jobs.launchers import LAUNCHERS, LaunchError

# -- accelerate's config file, named by `accelerate launch` / `trl sft` -------------------------


@pytest.mark.parametrize("launcher, words", [
    ("trl", ["sft", "--config_file", "/dev/zero"]),
    ("accelerate", ["launch", "--config_file", "/dev/zero", "train.py"]),
])
def test_a_config_file_that_never_ends_is_refused_at_once(launcher, words):
    """`--config_file /dev/zero` was read whole (`read_text()[:1 << 20]`): the command never
    answered and its memory grew until killed. Now only a regular file is read."""
    pytest.importorskip("yaml")
    if launcher == "trl":
        pytest.importorskip("trl")
    result: list[BaseException | None] = []

    def parse() -> None:
        try:
            LAUNCHERS[launcher](words)
            result.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            result.append(exc)

    thread = threading.Thread(target=parse, daemon=True)
    thread.start()
    thread.join(20)
    assert result, "the launcher's parser is still reading /dev/zero"
    assert isinstance(result[0], LaunchError)
    assert str(result[0]) == ("accelerate launch: cannot read the config file '/dev/zero' "
                              "(is a device, not a regular file)")


def test_a_config_file_fifo_and_non_utf8_are_one_line_errors(tmp_path):
    pytest.importorskip("yaml")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"num_processes: \xff\n")
    with pytest.raises(LaunchError, match=r"fifo\.yaml' \(is a FIFO, not a regular file\)$"):
        LAUNCHERS["accelerate"](["launch", "--config_file", str(fifo), "t.py"])
    with pytest.raises(LaunchError, match=r"bad\.yaml' \(not UTF-8 text\)$"):
        LAUNCHERS["accelerate"](["launch", "--config_file", str(bad), "t.py"])


def test_a_good_config_file_is_still_read(tmp_path):
    pytest.importorskip("yaml")
    config = tmp_path / "c.yaml"
    config.write_text("num_processes: 3\nmixed_precision: bf16\n")
    launch = LAUNCHERS["accelerate"](["launch", "--config_file", str(config), "t.py"])
    assert launch.nproc_per_node == 3


# -- the children's report directory ------------------------------------------------------------


def test_a_fifo_named_as_a_report_does_not_block_the_job(tmp_path):
    """The job can reach the reports' folder (its own process holds it): a FIFO named
    `spawned-1.json` there made `read_reports` block in `open` at the job's end until the time
    limit. Now it is skipped like any file that is not a regular one; the good report is read."""
    os.mkfifo(tmp_path / f"{spawned_children.REPORT_PREFIX}1.json")
    good = {"pid": 7, "parent": 1, "name": "c", "method": "subprocess", "start": 1.0,
            "end": 2.0, "steps": 0, "fake_limit": None, "exit_code": 0, "device": True,
            "peak_bytes": 5, "context_bytes": 1, "library_bytes": 1, "peak_reserved_bytes": 3,
            "peak_allocated_bytes": 2, "error": None}
    (tmp_path / f"{spawned_children.REPORT_PREFIX}7.json").write_text(json.dumps(good))
    found: list = []
    thread = threading.Thread(target=lambda: found.append(spawned_children.read_reports(tmp_path)),
                              daemon=True)
    thread.start()
    thread.join(10)
    assert found == [[good]]


# -- a loop ended at its head: the job's own view of the trace function -------------------------


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="loops are ended on CPython 3.11 only")
def test_the_job_sees_its_own_trace_function_while_an_end_is_planned():
    """While the end of a loop waits for its head, `sys.gettrace()` answered the capture's
    tracer (a job asserting `sys.gettrace() is None` failed, and was rerun and stopped with a
    note blaming its DataLoader), and the job's `sys.settrace(None)` switched the planned frame's
    tracing off: the loop was never ended and the capture waited for ever (the job ran all its
    steps). Now the job sees and sets its own function, and the loop still ends."""
    ends = LoopEnds()
    seen = []
    ran = 0
    for i in range(1000):
        ran = i
        if i == 0:
            ends.forward_started()
            assert ends.plan(1), ends.refused
            seen.append(sys.gettrace())
            sys.settrace(None)
            seen.append(sys.gettrace())
    assert sys.gettrace() is None and not ends.pending
    assert seen == [None, None]
    assert ran == 0  # the loop ended at its head after its first iteration
    assert sys.gettrace.__self__ is sys and sys.settrace.__self__ is sys  # the real ones back


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="loops are ended on CPython 3.11 only")
def test_an_abandoned_plan_leaves_no_ended_loop_and_no_tracing():
    """A plan whose loop never came back to its head (its tracing taken away by a
    `settrace` the job imported before the plan) is given up after MAX_STEPS_AFTER_END steps
    (capture.phases): before, the capture waited for ever."""
    ends = LoopEnds()
    ran = []
    for i in range(3):
        ran.append(i)
        if i == 0:
            ends.forward_started()
            assert ends.plan(1)
            assert ends.pending and len(ends.ended) == 1
            ends.abandon("its loop did not come back to its head")
    assert ran == [0, 1, 2]  # not ended
    assert not ends.pending and ends.ended == []
    assert ends.refused == "its loop did not come back to its head"
    assert sys.gettrace() is None and sys.gettrace.__self__ is sys

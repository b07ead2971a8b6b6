"""The child side: one result, from the original process only; os._exit delivers first."""

from __future__ import annotations

import os

from peakmem.jobs.child import ResultWriter, os_exit_hook


def test_a_fork_cannot_deliver_a_result(tmp_path):
    writer = ResultWriter(tmp_path / "result")
    pid = os.fork()
    if pid == 0:  # the fork: a write must do nothing
        code = 0 if writer.write(b"from the fork") is False else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not (tmp_path / "result").exists()
    assert writer.write(b"from the original") is True
    assert writer.write(b"twice") is False
    assert (tmp_path / "result").read_bytes() == b"from the original"


def test_os_exit_delivers_before_ending(tmp_path):
    writer = ResultWriter(tmp_path / "result")
    pid = os.fork()
    if pid == 0:
        # a fresh writer in the fork: the fork is its own "original" here
        inner = ResultWriter(tmp_path / "result")
        with os_exit_hook(inner, lambda code: inner.write(f"exit {code}".encode())):
            os._exit(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 5
    assert (tmp_path / "result").read_bytes() == b"exit 5"
    assert os._exit.__module__ == "posix"  # restored in this process
    assert writer.pid == os.getpid()

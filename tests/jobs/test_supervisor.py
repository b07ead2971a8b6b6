"""The parent side: process groups, wall-clock timeout, host memory cap, output, results."""

from __future__ import annotations

import math
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from peakmem.jobs.supervisor import (
    ChildSpec,
    Limits,
    OutcomeStatus,
    ResultFileError,
    group_members,
    read_result_file,
    run_child,
    run_children,
)


def python(tmp_path: Path, code: str, name: str = "job.py", **spec) -> ChildSpec:
    script = tmp_path / name
    script.write_text(textwrap.dedent(code))
    return ChildSpec(argv=[sys.executable, str(script)], result_path=tmp_path / "result", **spec)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_exit_status_and_output_to_a_file(tmp_path):
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    spec = python(tmp_path, """
        import os, sys
        print("to stdout"); sys.stdout.flush()
        os.write(2, b"to fd 2\\n")
        assert sys.stdin.read() == ""
        sys.exit(7)
    """, output_fd=log)
    outcome = run_child(spec)
    os.close(log)
    assert (outcome.status, outcome.returncode) == (OutcomeStatus.EXITED, 7)
    assert (tmp_path / "log").read_text() == "to stdout\nto fd 2\n"


def test_a_timeout_ends_a_job_that_ignores_signals_and_its_forks(tmp_path):
    pids = tmp_path / "pids"
    spec = python(tmp_path, f"""
        import os, signal
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
            signal.signal(sig, signal.SIG_IGN)
        child = os.fork()
        open({str(pids)!r}, "a").write(f"{{os.getpid()}}\\n")
        while True:
            try:
                pass
            except BaseException:
                pass
    """)
    started = time.monotonic()
    outcome = run_child(spec, Limits(timeout=1.0))
    assert outcome.status == OutcomeStatus.TIMEOUT and outcome.returncode is None
    assert time.monotonic() - started < 1.0 + 3.0
    for pid in map(int, pids.read_text().split()):
        assert not alive(pid)


def test_the_host_memory_cap_stops_a_hog(tmp_path):
    spec = python(tmp_path, """
        chunks = []
        while True:
            chunks.append(bytearray(8 * 2**20))
    """)
    outcome = run_child(spec, Limits(max_host_memory=150 * 2**20, timeout=60))
    assert outcome.status == OutcomeStatus.HOST_MEMORY
    assert outcome.peak_rss_bytes > 150 * 2**20


def test_a_segfault_is_a_signal(tmp_path):
    outcome = run_child(python(tmp_path, "import ctypes; ctypes.string_at(0)"))
    assert (outcome.status, outcome.signal) == (OutcomeStatus.SIGNALED, "SIGSEGV")


def test_leftover_processes_are_ended_with_the_job(tmp_path):
    pids = tmp_path / "pids"
    spec = python(tmp_path, f"""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
        q = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pids)!r}, "w").write(f"{{p.pid}} {{q.pid}}")
    """)
    outcome = run_child(spec, Limits(timeout=30))
    assert outcome.ok
    for pid in map(int, pids.read_text().split()):
        assert not alive(pid)


def test_several_children_and_fail_fast(tmp_path):
    specs = [
        python(tmp_path, "import time; time.sleep(30)", name="slow.py"),
        python(tmp_path, "raise SystemExit(3)", name="fails.py"),
    ]
    started = time.monotonic()
    slow, fails = run_children(specs, Limits(timeout=60))
    assert (fails.status, fails.returncode) == (OutcomeStatus.EXITED, 3)
    assert slow.status == OutcomeStatus.CANCELLED
    assert time.monotonic() - started < 10
    both = run_children([python(tmp_path, "pass", name=f"ok{i}.py") for i in range(3)])
    assert [o.ok for o in both] == [True, True, True]


def test_a_sandbox_prefixes_the_command(tmp_path):
    spec = python(tmp_path, """
        import os, sys
        sys.exit(0 if os.environ.get("PEAKMEM_TEST_SANDBOXED") == "1" else 4)
    """)
    assert run_child(spec, sandbox=["env", "PEAKMEM_TEST_SANDBOXED=1"]).ok


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -1.0, 0.0])
def test_limits_refuse_a_timeout_that_is_not_finite_and_positive(timeout):
    with pytest.raises(ValueError):
        Limits(timeout=timeout)


def test_group_members_finds_this_process_group():
    assert os.getpid() in group_members(os.getpgrp())


def test_result_files_are_read_safely(tmp_path):
    assert read_result_file(tmp_path / "none") is None
    (tmp_path / "ok").write_bytes(b"data")
    assert read_result_file(tmp_path / "ok") == b"data"
    (tmp_path / "big").write_bytes(b"x" * 100)
    with pytest.raises(ResultFileError, match="over"):
        read_result_file(tmp_path / "big", cap=10)
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    with pytest.raises(ResultFileError):
        read_result_file(tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ResultFileError, match="regular"):
        read_result_file(tmp_path / "fifo")


def test_supervisions_in_threads_do_not_end_each_others_children(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int):
        d = tmp_path / str(i)
        d.mkdir()
        return run_child(python(d, f"import time; time.sleep({0.2 * i})"), Limits(timeout=30))

    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(one, range(4)))
    assert all(o.ok for o in outcomes), outcomes


def test_a_sandbox_object_wraps_the_command_and_its_environment(tmp_path):
    class FakeSandbox:
        def __init__(self):
            self.scratch = None

        def wrap(self, argv, scratch, env=None):
            self.scratch = scratch
            return ["env", "WRAPPED=1", *argv]

        def environment(self, scratch, env=None):
            return {**os.environ, "SCRATCH": str(scratch)}

        def preexec_fn(self):
            pass

    sandbox = FakeSandbox()
    spec = python(tmp_path, """
        import os, sys
        ok = os.environ.get("WRAPPED") == "1" and os.environ.get("SCRATCH")
        sys.exit(0 if ok else 4)
    """)
    assert run_child(spec, sandbox=sandbox).ok
    assert sandbox.scratch == spec.result_path.parent


def test_this_process_is_a_subreaper_only_while_children_run(tmp_path):
    def subreaper() -> bool:
        import ctypes

        value = ctypes.c_int(0)
        ctypes.CDLL(None).prctl(37, ctypes.byref(value), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
        return bool(value.value)

    seen = tmp_path / "seen"
    spec = python(tmp_path, f"import time; open({str(seen)!r}, 'w').write('x'); time.sleep(1)")
    import threading

    during = []
    runner = threading.Thread(target=lambda: run_child(spec, Limits(timeout=30)))
    runner.start()
    while not seen.exists():
        time.sleep(0.05)
    during.append(subreaper())
    runner.join()
    assert during == [True] and not subreaper()

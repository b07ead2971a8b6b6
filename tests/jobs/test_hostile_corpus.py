"""The adversarial corpus (tests/data/hostile_scripts) through the real command line:
`python -m peakmem estimate --json --timeout T -- python <script>`.

For every script: peakmem's stdout is exactly one JSON object (an estimate, or the contract's
`{"error": {...}}`), the exit code is the contract's and the right one, no traceback from
peakmem's own frames reaches stderr, and nothing hangs past the timeout + 5 s. The runs go four
at a time (a session fixture) to keep the corpus near a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile_scripts"
SRC = Path(__file__).resolve().parents[2] / "src"
PEAKMEM_DIR = str(SRC / "peakmem")
CONTRACT = {0, 1, 2, 3, 70, 124}


@dataclass(frozen=True)
class Case:
    script: str
    code: int
    reason: str | None = None
    args: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    # 40 s: read_stdin and signal_handlers (5 s alone) ran past 20 s beside other runs on a
    # loaded 2-core machine; still under the 60 s that the children of fork_many_bounded and
    # setsid_grandchild sleep (a peakmem waiting for them ends in a timeout, not in success)
    timeout: float = 40
    job_exit_code: int | None = None
    signal: str | None = None

    @property
    def id(self) -> str:
        return "-".join([self.script.removesuffix(".py"), *self.args])


CASES = [
    Case("os_exit_zero_after_training.py", 0),
    Case("os_exit_three.py", 1, "os_exit", job_exit_code=3),
    Case("fork_continues.py", 0),
    Case("fork_many_bounded.py", 0),
    Case("subprocess_stdout.py", 0),
    Case("huge_stdout.py", 0),
    Case("os_write_fd1.py", 0),
    Case("close_fds.py", 0),
    Case("chdir_away.py", 0),
    Case("delete_self.py", 0),
    Case("exit_code.py", 0, args=("0",)),
    Case("exit_code.py", 1, "exit", args=("1",), job_exit_code=1),
    Case("exit_code.py", 1, "exit", args=("2",), job_exit_code=2),
    Case("exit_code.py", 1, "exit", args=("255",), job_exit_code=255),
    Case("exit_code.py", 1, "exit", args=("256",), job_exit_code=256),
    Case("exit_code.py", 1, "exit", args=("-1",), job_exit_code=-1),
    Case("exit_message.py", 1, "exit", job_exit_code=1),
    Case("exit_none.py", 0),
    Case("exit_true.py", 1, "exit", job_exit_code=1),
    Case("raise_base_exception.py", 1, "raised"),
    Case("keyboard_interrupt.py", 1, "raised"),
    Case("bad_str_exception.py", 1, "raised"),
    Case("bad_repr_exception.py", 1, "raised"),
    Case("segfault.py", 1, "signal", signal="SIGSEGV"),
    Case("kill_self.py", 1, "signal", signal="SIGKILL"),
    Case("ignore_signals_loop.py", 124, "timeout", timeout=3),
    Case("catch_all_sleep_loop.py", 124, "timeout", timeout=3),
    Case("del_and_atexit_raise.py", 0),
    Case("threads_keep_running.py", 0),
    Case("signal_handlers.py", 0),
    Case("read_stdin.py", 0),
    Case("memory_hog.py", 1, "host_memory", flags=("--max-host-memory", "400MB")),
    Case("syntax_error.py", 1, "raised"),
    Case("non_utf8.py", 1, "raised"),
    Case("recursion.py", 1, "raised"),
    Case("raise_in_training.py", 1, "raised"),
    Case("forge_result.py", 1, "bad_result"),
    Case("setsid_grandchild.py", 0),
    Case("sys_exit_in_thread_then_raise.py", 1, "raised"),
    Case("posix_exit.py", 1, "no_result", job_exit_code=0),
    Case("exec_other_program.py", 1, "no_result", job_exit_code=0),
    Case("delete_result_dir.py", 1, "no_result", job_exit_code=1),
    Case("hostile_exit_code.py", 1, "exit", job_exit_code=3),
    Case("hostile_exception_class.py", 1, "raised"),
]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    workdir: Path


def run_estimate(workdir: Path, argv: list[str], timeout: float) -> Run:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", *argv],
        cwd=workdir, env=env, capture_output=True, text=True, errors="replace",
        timeout=timeout + 30, stdin=subprocess.DEVNULL,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started, workdir)


def _run_case(case: Case, root: Path) -> Run:
    workdir = root / case.id
    shutil.copytree(CORPUS, workdir)
    argv = ["--json", "--gpu", "a100-40gb", "--timeout", str(case.timeout), *case.flags,
            "--", "python", case.script, *case.args]
    return run_estimate(workdir, argv, case.timeout)


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory) -> dict[str, Run]:
    """Every case's cold `peakmem estimate`: the module's one slow setup (192 s in a CI run at
    load 2-4), and it stays slow. Nothing in it sleeps or waits out a limit but the two 3 s
    `--timeout` cases: each run starts a job interpreter that imports torch, `torch._dynamo`
    and the capture before the script runs (the CLI's own part is about a tenth), and every
    case costs alike, 3.9-4.7 s of CPU (29-47 s of wall at load ~19) for six of them, 44 x ~4.5 s
    in all (`benchmarks/corpus_case_times.py tests.jobs.test_hostile_corpus --timeout 600
    --only exit_none fork_continues os_exit_zero_after_training syntax_error exit_code-1
    threads_keep_running`, 2026-11-28 18:49 UTC). That cold start is the path this corpus tests
    (a warm process's forked child is test_zygote's and the library jobs')."""
    root = tmp_path_factory.mktemp("hostile")
    # at most one run per CPU core: the time bound below is for peakmem's start-up, not for
    # runs queued behind each other on the cores (the suite's other xdist worker runs beside it)
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        futures = {case.id: pool.submit(_run_case, case, root) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


def peakmem_frames(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if line.strip().startswith("File ") and PEAKMEM_DIR in line]


def test_the_corpus_is_large_enough():
    assert len({case.script for case in CASES}) >= 25
    assert all((CORPUS / case.script).is_file() for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_hostile_script(case: Case, corpus_runs: dict[str, Run]):
    run = corpus_runs[case.id]
    assert run.returncode in CONTRACT
    assert run.returncode == case.code, (run.stdout, run.stderr[-3000:])
    assert run.seconds < case.timeout + 5 + 10  # + peakmem's own start-up under load
    payload = json.loads(run.stdout)  # exactly one JSON object, nothing else on stdout
    assert isinstance(payload, dict)
    assert run.stdout.strip().count("\n") == 0
    assert not peakmem_frames(run.stderr), run.stderr[-3000:]
    if case.code == 0:
        assert "peak_bytes" in payload and "error" not in payload
        return
    error = payload["error"]
    assert set(error) == {"kind", "message", "exit_code", "reason", "job_exit_code", "signal",
                          "traceback"}
    assert error["exit_code"] == case.code
    assert error["kind"] == {1: "job_failed", 2: "bad_input", 124: "timeout"}[case.code]
    assert error["reason"] == case.reason
    assert "\n" not in error["message"] and error["message"]
    if case.job_exit_code is not None:
        assert error["job_exit_code"] == case.job_exit_code
    if case.signal is not None:
        assert error["signal"] == case.signal
    if error["traceback"]:
        assert PEAKMEM_DIR not in error["traceback"]

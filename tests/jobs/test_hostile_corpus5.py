"""A fifth adversarial corpus: hostile jobs (tests/data/hostile_scripts5) and hostile inputs
that test_hostile_corpus.py, _2.py, _3.py and _4.py do not cover.

Each case names what went wrong before its fix.
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

from peakmem.jobs.host_memory import (
    DEFAULT_FRACTION,
    HostMemorySettingError,
    default_max_host_memory,
    machine_memory_bytes,
)

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile_scripts5"
SRC = Path(__file__).resolve().parents[2] / "src"
PEAKMEM_DIR = str(SRC / "peakmem")


# -- hostile jobs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    script: str
    code: int
    reason: str | None = None
    args: tuple[str, ...] = ()
    message: str | None = None
    timeout: float = 60
    env: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        return "-".join([self.script.removesuffix(".py"), *self.args])


CASES = [
    # RLIMIT_FSIZE lowered to 0 for good (soft and hard) after training: every write() to a
    # file fails (EFBIG), the result's too: no_result for a job python runs to its end
    Case("rlimit_fsize_hard_zero.py", 0),
    # no --max-host-memory: no cap at all, a job allocating 50 GiB took the machine (the
    # default is a share of the machine's memory; PEAKMEM_MAX_HOST_MEMORY sets it, as here)
    Case("host_memory_hog.py", 1, "host_memory", message="went over",
         env=(("PEAKMEM_MAX_HOST_MEMORY", "600MB"),)),
]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    workdir: Path


def _run_case(case: Case, root: Path) -> Run:
    workdir = root / case.id
    shutil.copytree(CORPUS, workdir)
    env = {**os.environ, "PYTHONPATH": str(SRC), "PEAKMEM_WARM": "0", **dict(case.env)}
    argv = [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "a100-40gb",
            "--timeout", str(case.timeout), "--", "python", case.script, *case.args]
    started = time.monotonic()
    # output to files: a pipe would stay open as long as a process of the job holds it
    with open(workdir / ".out", "wb") as out, open(workdir / ".err", "wb") as err:
        proc = subprocess.run(argv, cwd=workdir, env=env, stdout=out, stderr=err,
                              timeout=case.timeout + 60, stdin=subprocess.DEVNULL)
    return Run(proc.returncode, (workdir / ".out").read_text(errors="replace"),
               (workdir / ".err").read_text(errors="replace"), time.monotonic() - started,
               workdir)


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("hostile5")
    with ThreadPoolExecutor(max_workers=max(1, min(3, os.cpu_count() or 1))) as pool:
        futures = {case.id: pool.submit(_run_case, case, root) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_hostile_job(case: Case, corpus_runs: dict[str, Run]):
    run = corpus_runs[case.id]
    assert run.returncode == case.code, (run.stdout, run.stderr[-3000:])
    assert run.stdout.strip().count("\n") == 0
    payload = json.loads(run.stdout)
    assert not [line for line in run.stderr.splitlines()
                if line.strip().startswith("File ") and PEAKMEM_DIR in line], run.stderr[-3000:]
    if case.code == 0:
        assert payload["peak_allocated_bytes"] > 0 and "error" not in payload
    else:
        assert payload["error"]["reason"] == case.reason
        assert "\n" not in payload["error"]["message"]
        assert case.message is None or case.message in payload["error"]["message"]


# -- the default host-memory cap --------------------------------------------------------------


def test_the_default_host_memory_cap_is_a_share_of_the_machines_memory(tmp_path):
    total = machine_memory_bytes()
    assert total is not None and total > 2**28
    assert default_max_host_memory({}) == int(total * DEFAULT_FRACTION)
    assert default_max_host_memory({"PEAKMEM_MAX_HOST_MEMORY": "1.5GiB"}) == 3 * 2**29
    assert default_max_host_memory({"PEAKMEM_MAX_HOST_MEMORY": "off"}) is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8000000 kB\nMemFree:  1 kB\n")
    limit = tmp_path / "memory.max"
    limit.write_text("2147483648\n")  # a container's cgroup limit, below MemTotal
    assert machine_memory_bytes(meminfo, (str(limit),)) == 2**31
    limit.write_text("max\n")
    assert machine_memory_bytes(meminfo, (str(limit),)) == 8000000 * 1024


@pytest.mark.parametrize("setting", ["garbage", "-1GB", "nan", "0", "9" * 80])
def test_a_garbage_host_memory_setting_is_refused(setting):
    with pytest.raises(HostMemorySettingError, match="PEAKMEM_MAX_HOST_MEMORY"):
        default_max_host_memory({"PEAKMEM_MAX_HOST_MEMORY": setting})


def test_a_garbage_host_memory_setting_is_one_bad_input_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from peakmem.cli.main import main

    (tmp_path / "train.py").write_text("print('never run')\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["estimate", "--json", "--", "python", "train.py"],
                                env={"PEAKMEM_MAX_HOST_MEMORY": "lots", "PEAKMEM_WARM": "0"})
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert error["reason"] == "bad_input" and "PEAKMEM_MAX_HOST_MEMORY='lots'" in error["message"]

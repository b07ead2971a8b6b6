"""The k5 adversarial sweep's regressions (benchmarks/hostile_sweep_k5.py runs the whole sweep):
one test per class of hostile input that broke the contract before its fix. Each docstring says
what went wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
JOB = ["python", "train.py"]


def peakmem(*args: str, cwd: Path, timeout: float = 60, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.run([sys.executable, "-m", "peakmem", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


# -- jobs files (batch, pack --jobs) ----------------------------------------------------------


@pytest.mark.parametrize("body", [b"[1, 2]\n", b"{\n", b'{"id": "\xff", "command": []}\n',
                                  b'{"id": 5, "command": ["python", "train.py"]}\n'])
def test_batch_refuses_a_bad_jobs_file_in_one_line(tmp_path, body):
    """The progress bar was drawn before the jobs file was read: a bad file gave two stderr
    lines (an empty bar, then the error)."""
    (tmp_path / "jobs.jsonl").write_bytes(body)
    proc = peakmem("batch", "--in-process", "jobs.jsonl", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("peakmem: error: ") and "jobs.jsonl" in lines[0], lines
    assert "Traceback" not in proc.stderr


def test_batch_summary_of_a_job_with_a_huge_hostile_id_is_fast_and_plain(tmp_path):
    """A 100k-character id: the failure summary went through rich's highlighter, which took
    minutes on it (a hang); rich markup in an id (`[red]`) was interpreted."""
    entries = [{"id": "i" * 100_000, "command": JOB},
               {"id": "[bold red]x\x1b[2J", "command": ["python", "missing.py"]}]
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    proc = peakmem("batch", "--in-process", "jobs.jsonl", cwd=tmp_path, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    assert "1 failed" in proc.stderr or "2 failed" in proc.stderr
    assert "[bold red]x" in proc.stderr and "\x1b" not in proc.stderr
    assert max(len(line) for line in proc.stderr.splitlines()) < 1000


def test_pack_checks_every_jobs_file_entry_before_the_first_estimate(tmp_path):
    """An unknown GPU on line 2 was found only once job 1 had been estimated (its progress
    line came first; with many jobs, after minutes of estimates)."""
    (tmp_path / "train.py").write_text("import torch\n")
    (tmp_path / "jobs.jsonl").write_text(
        json.dumps({"id": "a", "command": JOB}) + "\n"
        + json.dumps({"id": "b", "command": JOB, "gpu": "no-such-gpu"}) + "\n")
    proc = peakmem("pack", "--gpus", "1xh100-80gb", "--jobs", "jobs.jsonl", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == [stderr_lines(proc)[0]]
    assert "job 'b'" in proc.stderr and "no-such-gpu" in proc.stderr
    assert "estimating" not in proc.stderr

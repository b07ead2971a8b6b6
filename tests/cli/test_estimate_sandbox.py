"""`peakmem estimate --sandbox`: the job runs without write access outside its scratch directory,
or the estimate fails closed (exit 3) where no sandbox can be built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from peakmem.jobs.sandbox import Sandbox, SandboxUnavailable

SRC = Path(__file__).resolve().parents[2] / "src"

JOB = """
import torch
from torch import nn

try:
    with open("written-by-the-job", "w") as handle:
        handle.write("x")
except OSError:
    pass
model = nn.Linear(16, 16).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def _estimate(cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    (cwd / "job.py").write_text(textwrap.dedent(JOB))
    return subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--sandbox", "--json", "--timeout", "120",
         "--", "python", "job.py"],
        cwd=cwd, env={**os.environ, "PYTHONPATH": str(SRC), **env}, capture_output=True,
        text=True, timeout=240, stdin=subprocess.DEVNULL,
    )


def test_sandbox_fails_closed_where_it_cannot_be_built(tmp_path):
    empty = tmp_path / "no-tools"
    empty.mkdir()
    run = _estimate(tmp_path, {"PATH": str(empty)})  # neither bwrap nor unshare is found
    assert run.returncode == 3, run.stderr
    error = json.loads(run.stdout)["error"]
    assert error["kind"] == "unsupported" and error["exit_code"] == 3
    assert error["message"].startswith("peakmem: --sandbox is not available here:")
    assert not (tmp_path / "written-by-the-job").exists()


def test_sandboxed_job_estimates_and_cannot_write_its_directory(tmp_path):
    if isinstance(Sandbox.probe(), SandboxUnavailable):
        pytest.skip("no sandbox can be built on this machine")
    run = _estimate(tmp_path, {})
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["estimate_kind"] == "training" and result["steps"] == 3
    assert not (tmp_path / "written-by-the-job").exists()

"""A job that starts its training in a Python process of its own (capture.python_subprocesses):
that process runs outside the fake GPU, so a failure names the command to estimate instead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from peakmem.capture.python_subprocesses import python_command
from peakmem.estimate import EstimateError, estimate_command

INNER = """\
import torch
model = torch.nn.Linear(256, 256).cuda()
model(torch.randn(4, 256, device="cuda")).sum().backward()
"""


def test_python_command():
    assert python_command([sys.executable, "train.py", "--lr", "1"]) == "python train.py --lr 1"
    assert python_command(["python3", "-u", "-m", "pkg.train"]) == "python -m pkg.train"
    assert python_command("python train.py --x 'a b'", shell=True) == "python train.py --x 'a b'"
    assert python_command(["/usr/bin/torchrun", "--nproc-per-node", "2", "t.py"]) == (
        "torchrun --nproc-per-node 2 t.py")
    assert python_command([sys.executable, "-c", "print(1)"]) is None
    assert python_command(["echo", "python", "t.py"]) is None
    assert python_command("python train.py") is None  # one program named so, without a shell
    assert python_command(None) is None and python_command([]) is None


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "inner_train.py").write_text(INNER)
    (tmp_path / "wrapper.py").write_text(
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, 'inner_train.py', '--epochs', '1'], check=True)\n")
    (tmp_path / "helper.py").write_text(
        "import subprocess, sys, torch\n"
        "subprocess.run([sys.executable, 'inner_train.py'], stderr=subprocess.DEVNULL)\n"
        "x = torch.empty(2**20, device='cuda')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_failed_wrapper_names_the_command_to_estimate(workdir):
    with pytest.raises(EstimateError) as failed:
        estimate_command(["python", "wrapper.py"], gpu="a100-40gb", mode="fake", timeout=120)
    message = failed.value.message
    assert message.startswith("the job raised CalledProcessError")
    assert "`peakmem estimate -- python inner_train.py --epochs 1`" in message
    assert "\n" not in message


def test_a_job_that_succeeds_gets_a_note(workdir):
    result = estimate_command(["python", "helper.py"], gpu="a100-40gb", mode="fake",
                              isolate=False)
    assert result.peak_allocated_bytes == 4 * 2**20
    assert any("another Python process (`python inner_train.py`)" in note
               for note in result.notes)

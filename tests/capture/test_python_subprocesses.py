"""A job that starts its training in a Python process of its own (capture.python_subprocesses):
in a supervised job's process that process runs under the fake GPU (tests/jobs/
test_subprocess_children.py); in-process (`isolate=False`) and for launchers it runs outside,
so a note names the command to estimate instead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from peakmem.capture.python_subprocesses import python_command
from peakmem.estimate import estimate_command

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


def test_a_wrapper_runs_its_training_under_the_fake_gpu(workdir):
    # was: CalledProcessError (the child's "Torch not compiled with CUDA enabled"), and a
    # one-line error naming `peakmem estimate -- python inner_train.py --epochs 1`
    result = estimate_command(["python", "wrapper.py"], gpu="a100-40gb", mode="fake", timeout=300)
    (child,) = result.processes
    assert child["name"] == "python inner_train.py --epochs 1" and child["exit_code"] == 0
    assert child["steps"] == 0 and child["device"]
    # torch-2.11 rules on an sm_80 card: two cuBLAS workspaces of 8519680 B (":4096:2:16:8"; the
    # forward's handle and autograd's) share one 20 MiB large segment (kLargeBuffer: a request
    # under 10 MiB gets 20 MiB, the second splits its rest); the tensors (256 KiB weight, its
    # grad, bias, 4 KiB activations) and the 1 MiB cuBLASLt workspace fit one 2 MiB small segment
    assert child["peak_reserved_bytes"] == 20 * 2**20 + 2 * 2**20
    assert result.peak_bytes == child["peak_bytes"] and result.context_bytes == 0
    assert not any("another Python process" in note for note in result.notes)


def test_a_job_that_succeeds_gets_a_note(workdir):
    result = estimate_command(["python", "helper.py"], gpu="a100-40gb", mode="fake",
                              isolate=False)
    assert result.peak_allocated_bytes == 4 * 2**20
    assert any("another Python process (`python inner_train.py`)" in note
               for note in result.notes)

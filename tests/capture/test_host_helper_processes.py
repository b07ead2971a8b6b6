"""Python processes libraries start for host facts only (capture.python_subprocesses'
HOST_HELPERS: py-cpuinfo's `cpuinfo.py --json`, started by DeepSpeed's CPU Adam) get no "estimate
that command itself" note: they never touch a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from peakmem.capture.python_subprocesses import host_helper
from peakmem.estimate import estimate_command


def test_host_helper_matches_the_script_path_only():
    probe = "/site-packages/cpuinfo/cpuinfo.py"
    assert host_helper([sys.executable, probe, "--json"]) is not None
    assert host_helper([sys.executable, "cpuinfo/cpuinfo.py"]) is not None
    assert host_helper([sys.executable, "train.py", "--json"]) is None
    assert host_helper([sys.executable, "/x/mycpuinfo/cpuinfo.py"]) is None  # another package
    assert host_helper(None) is None


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "cpuinfo").mkdir()
    (tmp_path / "cpuinfo" / "cpuinfo.py").write_text("print('{}')\n")
    (tmp_path / "other.py").write_text("print('{}')\n")
    (tmp_path / "job.py").write_text(
        "import subprocess, sys, torch\n"
        "subprocess.run([sys.executable, 'cpuinfo/cpuinfo.py', '--json'], capture_output=True)\n"
        "subprocess.run([sys.executable, sys.argv[1]], capture_output=True)\n"
        "x = torch.empty(2**20, device='cuda')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_cpu_probe_gets_no_note_another_script_does(workdir):
    result = estimate_command(["python", "job.py", "other.py"], gpu="a100-40gb", mode="fake",
                              isolate=False)
    notes = [note for note in result.notes if "another Python process" in note]
    assert notes and all("cpuinfo" not in note for note in notes)
    assert any("`python other.py`" in note for note in notes)

"""The capture leaves no temporary files behind (capture.side_effects `SCRATCH_PARENT`,
capture.supervised): the scratch copies of a job's diverted saves go when the capture ends,
however the job ends (normally, raising, `os._exit`, killed at --timeout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

from peakmem.capture import capture_callable, side_effects

SRC = Path(__file__).resolve().parents[2] / "src"
JOB = """\
    import os, sys, time
    import torch
    model = torch.nn.Linear(8, 4).cuda()
    torch.save(model.state_dict(), "ckpt.pt")  # fake device data: diverted to the scratch
    assert set(torch.load("ckpt.pt")) == {"weight", "bias"}  # read back from there
    how = sys.argv[1]
    if how == "raise":
        raise RuntimeError("the job's own error")
    if how == "exit":
        os._exit(3)
    if how == "spin":
        while True:
            time.sleep(0.05)
"""


def _peakmem_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("peakmem-"))


@pytest.mark.parametrize(("how", "extra", "reason"), [
    ("end", [], None),
    ("raise", [], "raised"),
    ("exit", [], "os_exit"),
    ("spin", ["--timeout", "6"], "timeout"),
])
def test_cli_estimate_leaves_no_temporary_files(tmp_path, how, extra, reason):
    private = tmp_path / "tmp"
    private.mkdir()
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    env = {**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(private)}
    done = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "h200", *extra, "--",
         "python", "job.py", how],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
        stdin=subprocess.DEVNULL)
    data = json.loads(done.stdout)
    assert data.get("error", {}).get("reason") == reason, (done.stdout[-2000:], done.stderr[-2000:])
    if reason is None:
        assert any("fake device data" in note for note in data["notes"])
    assert _peakmem_entries(private) == []
    assert not (tmp_path / "ckpt.pt").exists()  # the fake save never reached the user's path


def test_in_process_capture_leaves_no_temporary_files(a100, stack24, tmp_path, monkeypatch):
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setattr(side_effects, "SCRATCH_PARENT", None)
    monkeypatch.chdir(tmp_path)

    def job():
        model = torch.nn.Linear(8, 4).cuda()
        torch.save(model.state_dict(), "ckpt.pt")
        assert set(torch.load("ckpt.pt")) == {"weight", "bias"}
        raise RuntimeError("the job's own error")  # the scratch goes on a failure too

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.reason == "raised"
    assert any("fake device data" in note for note in result.notes)
    assert _peakmem_entries(private) == []

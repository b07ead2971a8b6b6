"""A job that puts itself in a session or group of its own (`os.setsid()`, `os.setpgid(0, 0)`,
`os.setpgrp()`): peakmem already starts it as a session leader, which Linux refuses both calls
(EPERM), so such a job failed with PermissionError under peakmem only (k7 sweep, "own session
then spins" / "own process group then spins"). jobs/own_session.py answers them as a process
that is not a leader gets them answered; every other refusal stays the OS's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "setsid"), reason="POSIX sessions")

PROBE = """
import os
from peakmem.jobs.own_session import own_session_calls
results = []
try:
    os.setsid()
    results.append("real setsid ok")
except PermissionError:
    results.append("real setsid EPERM")
with own_session_calls():
    for call in (os.setsid, lambda: os.setpgid(0, 0), os.setpgrp):
        try:
            value = call()
            results.append("ok" if value in (None, os.getpid()) else f"odd {value}")
        except PermissionError:
            results.append("EPERM")
print(" ".join(results))
"""


def _probe(**popen) -> str:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=60, env={**os.environ}, **popen)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_session_leader_gets_what_it_asked_for():
    # peakmem's job processes are session leaders: the OS refuses, the shim answers
    assert _probe(start_new_session=True) == "real setsid EPERM ok ok ok"


def test_a_group_leader_in_another_session_is_still_refused():
    # not peakmem's doing (an interactive shell's job): setsid stays refused as the OS refuses it
    # (setpgid to its own group is allowed by the OS itself)
    assert _probe(process_group=0) == "real setsid EPERM EPERM ok ok"


JOB = """import os
import torch
model = torch.nn.Linear(8, 8).cuda()
os.setpgid(0, 0)
os.setpgrp()
sid = os.setsid()
model(torch.randn(2, 8, device="cuda")).sum().backward()
print("session", sid == os.getpid())
"""


def test_a_job_that_detaches_itself_is_estimated(tmp_path):
    (tmp_path / "train.py").write_text(JOB)
    proc = subprocess.run([sys.executable, "-m", "peakmem", "estimate", "--json", "train.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "session True" in proc.stderr
    assert json.loads(proc.stdout)["peak_allocated_bytes"] > 0

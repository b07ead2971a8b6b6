"""Auto mode reruns in eager mode a fake capture whose job process crashed (estimate/api.py
`eager_fallback_reason`, `CRASH_SIGNALS`): native code fed the zeros fake mode answers host reads
of device values with can crash the process (scikit-learn's Barnes-Hut TSNE over an all-zero
embedding segfaults: PyG's argva_node_clustering.py plots one after training), and the child's
result dies with it. A process killed from outside (SIGKILL: the OOM killer) is not rerun."""

import pytest

from peakmem.capture.result import CaptureResult
from peakmem.capture.supervised import outcome_capture
from peakmem.estimate.api import eager_fallback_reason
from peakmem.jobs.supervisor import ChildOutcome, OutcomeStatus
from tests.library_jobs.harness import estimate

JOB = """\
import os, signal
import torch
from torch import nn

model = nn.Linear(32, 4).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(64, 32, device="cuda")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
# a host read of a device value (fake mode: 0.0), then a native crash on a zero
if torch.randn(8, device="cuda").abs().sum().item() == 0:
    os.kill(os.getpid(), signal.SIGSEGV)
print("done")
"""


def _signaled(name: str) -> CaptureResult:
    outcome = ChildOutcome(status=OutcomeStatus.SIGNALED, returncode=None, signal=name, pid=1)
    return outcome_capture(outcome, "fake", timeout=60.0, max_host_memory=None)


@pytest.mark.parametrize("name", ["SIGSEGV", "SIGBUS", "SIGFPE", "SIGABRT"])
def test_a_crash_signal_is_a_reason_to_run_eagerly(name):
    capture = _signaled(name)
    assert capture.reason == "signal" and capture.signal == name
    assert eager_fallback_reason(capture) == (
        f"the job's process was killed by {name}: native code may have crashed on the zeros "
        "fake mode answers host reads of device values with")


def test_a_kill_from_outside_is_not():
    assert eager_fallback_reason(_signaled("SIGKILL")) is None


def test_auto_mode_reruns_the_crashed_job_eagerly(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    fake = estimate(str(script), flags=("--gpu", "a100-40gb", "--mode", "fake"), cwd=tmp_path)
    assert fake.returncode != 0
    assert "killed by SIGSEGV" in fake.failure()
    auto = estimate(str(script), flags=("--gpu", "a100-40gb"), cwd=tmp_path)
    assert auto.returncode == 0, auto.failure()
    assert auto.data["mode"] == "eager"
    assert "killed by SIGSEGV" in auto.data["mode_reason"]
    assert auto.data["steps"] == 2 and "done" in auto.stderr
    # the Linear's weight (512 B) and bias: one block each
    assert auto.breakdown["parameter"] == 2 * 512

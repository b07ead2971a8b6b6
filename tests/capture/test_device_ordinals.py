"""Device ordinals the job has no GPU of (capture/device_ordinals.py): a CUDA machine raises
"invalid device ordinal", so the estimate ends with that job error, not a silent estimate;
ordinals within a node (model parallelism in one process, a launch's local ranks) still run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from peakmem.capture import capture_callable

BAD_ORDINALS = {
    "set_device": lambda: torch.cuda.set_device(10**20),
    "factory": lambda: torch.zeros(4, device=torch.device("cuda:99")),
    "to": lambda: torch.ones(4).to("cuda:99"),
    "cuda": lambda: torch.ones(4).cuda(99),
    "module": lambda: torch.nn.Linear(4, 4).to(torch.device("cuda", 8)),
    "device_context": lambda: torch.cuda.device(99).__enter__(),
    "accelerator": lambda: torch.accelerator.set_device_index(99),
}


@pytest.mark.parametrize("name", sorted(BAD_ORDINALS))
def test_an_ordinal_beyond_the_node_raises_the_job_error(a100, stack24, name):
    def job():
        torch.nn.Linear(64, 64).cuda()
        BAD_ORDINALS[name]()

    result = capture_callable(job, gpu=a100, stack=stack24, mode="fake")
    assert result.error is not None
    assert "CUDA error: invalid device ordinal" in result.error_text, result.error_text
    assert result.fake_limit is None  # the job's own error, not a limit of fake mode


def test_valid_ordinals_and_negative_ones_still_run(a100, stack24):
    seen = {}

    def job():
        torch.cuda.set_device(0)
        torch.cuda.set_device(-1)  # torch skips a negative ordinal
        with torch.cuda.device(-1), torch.cuda.device(0):
            seen["device"] = torch.zeros(4, device="cuda:0").device
        seen["named"] = torch.device("cuda:99").index  # only using it is an error on CUDA
        seen["second"] = torch.zeros(4, device="cuda:1").shape  # beside cuda:0: noted

    result = capture_callable(job, gpu=a100, stack=stack24, mode="fake")
    assert result.error is None, result.error_text
    assert seen == {"device": torch.device("cuda", 0), "named": 99, "second": torch.Size([4])}


def _estimate(tmp_path, body: str, *flags: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text("import os\nimport torch\n" + body)
    return subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--gpu", "h100", *flags, "--",
         sys.executable, str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )


def test_the_cli_ends_with_the_jobs_error(tmp_path):
    done = _estimate(tmp_path, 'torch.nn.Linear(8, 8).cuda()\ntorch.cuda.set_device(10**20)\n')
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("peakmem: error: the job raised RuntimeError: CUDA error: invalid "
                           "device ordinal"), done.stderr


def test_a_launchs_local_ranks_are_the_nodes_gpus(tmp_path):
    # 16 processes per node: cuda:12 exists on rank 0's node, cuda:16 does not
    body = ('torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n'
            'torch.zeros(4, device="cuda:12")\nprint("twelve ok", flush=True)\n'
            'torch.zeros(4, device="cuda:16")\n')
    done = _estimate(tmp_path, body, "--nproc-per-node", "16")
    assert "twelve ok" in done.stdout + done.stderr
    assert done.returncode == 1
    assert "invalid device ordinal (cuda:16" in done.stderr, done.stderr

"""`peakmem estimate` leaves the user's files as they were, whatever the job wrote, changed or
removed, and however it ended (through the real CLI and a real capture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.job_files_tree import CHANGES, snapshot, user_tree

SRC = Path(__file__).resolve().parents[2] / "src"

JOB = CHANGES + """
import torch
torch.save({"rng": torch.arange(4)}, "runs/rng_state.pth")
torch.save({"rng": torch.arange(4)}, "config.json")  # over an existing file, by torch's writer
assert torch.load("runs/rng_state.pth")["rng"].tolist() == [0, 1, 2, 3]
model = torch.nn.Linear(8, 8).cuda()
model(torch.randn(4, 8, device="cuda")).sum().backward()
torch.save(model.state_dict(), "runs/checkpoint-2/model.pt")
print("JOB-CHANGED-THE-TREE", flush=True)
"""

ENDINGS = {"returns": "", "timeout": "import time; time.sleep(600)"}


def estimate(work: Path, job: str, *flags: str, timeout: float = 240
             ) -> tuple[dict, subprocess.CompletedProcess]:
    """`peakmem estimate --json FLAGS -- python job.py` in `work`, with the job's script in its
    own directory and a temp directory of its own (the tree is under the system's)."""
    script = work.parent / "scripts" / "job.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(job)
    temp = work.parent / "systemp"
    temp.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(temp)}
    done = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "h100-80gb", *flags,
         "--", sys.executable, str(script)],
        cwd=work, env=env, capture_output=True, text=True, timeout=timeout + 60,
    )
    return (json.loads(done.stdout) if done.stdout.strip() else {}), done


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_the_tree_is_as_it_was_after_the_estimate(tmp_path, ending):
    work = user_tree(tmp_path)
    before = snapshot(work)
    flags = ("--mode", "fake", "--timeout", "30") if ending == "timeout" else ("--mode", "fake")
    data, done = estimate(work, JOB + ENDINGS[ending], *flags)
    assert "JOB-CHANGED-THE-TREE" in done.stderr, done.stderr[-3000:]
    assert snapshot(work) == before
    if ending == "timeout":
        assert done.returncode == 124, done.stderr[-3000:]
        return
    assert done.returncode == 0, done.stderr[-3000:]
    assert any("peakmem put them back as they were" in note for note in data["notes"]), data


def test_keep_job_files_keeps_what_the_job_wrote(tmp_path):
    work = user_tree(tmp_path)
    data, done = estimate(work, "open('new.log', 'w').write('kept')\n", "--keep-job-files")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (work / "new.log").read_text() == "kept"
    assert not any("put them back" in note for note in data["notes"]), data


def test_keep_job_files_is_in_the_help():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-m", "peakmem", "estimate", "--help"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert "--keep-job-files" in done.stdout


RANKS = """
import os, torch, torch.distributed as dist
dist.init_process_group(backend="nccl", init_method="env://")
rank = dist.get_rank()
torch.cuda.set_device(rank)
os.makedirs("runs/ddp", exist_ok=True)
with open(f"runs/ddp/rank{rank}.log", "w") as f:
    f.write("loss 1.0")
with open("runs/train.log", "a") as f:  # every rank appends to the user's log
    f.write(f"rank {rank}\\n")
if rank == 1:
    os.remove("old.txt")
model = torch.nn.Linear(8, 8).cuda()
model(torch.randn(4, 8, device="cuda")).sum().backward()
print(f"RANK-{rank}-WROTE", flush=True)
dist.destroy_process_group()
"""


def test_every_rank_of_a_distributed_launch_is_put_back(tmp_path):
    work = user_tree(tmp_path)
    before = snapshot(work)
    data, done = estimate(work, RANKS, "--mode", "fake", "--ranks", "all",
                          "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RANK-0-WROTE" in done.stderr and "RANK-1-WROTE" in done.stderr
    assert snapshot(work) == before
    assert any("peakmem put them back as they were" in note for note in data["notes"]), data

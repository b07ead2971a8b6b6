"""`peakmem estimate` of distributed launches, end to end (each rank in a child of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# rank 1 holds an extra 64 MiB buffer: `--ranks all` must find it the largest
UNEVEN = """
    import os, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group(backend="nccl", init_method="env://")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    assert dist.get_world_size() == int(os.environ["WORLD_SIZE"]) == 4
    assert dist.get_backend() == "nccl" and torch.cuda.device_count() == 4
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, {"rank": rank})
    assert sizes == [{"rank": rank}] * 4
    model = DDP(torch.nn.Linear(64, 64).cuda(), device_ids=[local])
    extra = torch.empty(16 * 2**20, device="cuda") if rank == 1 else None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    # one write: ranks share peakmem's stderr, and print's separate pieces could interleave
    print(f"rank {rank} local {local} args {sys.argv[1:]}", flush=True)
    dist.destroy_process_group()
"""


def cli(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "peakmem", "estimate", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_torchrun_all_ranks_reports_each_and_the_largest(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(UNEVEN))
    result = cli(tmp_path, "--json", "--mode", "fake", "--ranks", "all", "--", "torchrun",
                 "--nproc-per-node", "4", "train.py", "--x", "1")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["world_size"] == 4 and data["launcher"] == "torchrun"
    assert [row["rank"] for row in data["ranks"]] == [0, 1, 2, 3]
    assert data["largest_rank"] == 1
    peaks = {row["rank"]: row["peak_allocated_bytes"] for row in data["ranks"]}
    assert peaks[0] == peaks[2] == peaks[3]
    assert peaks[1] - peaks[0] >= 64 * 2**20
    assert data["peak_bytes"] == max(row["peak_bytes"] for row in data["ranks"])
    assert data["libraries"]["nccl"] > 0  # the NCCL communicator, outside the allocator
    # DDP's one gradient bucket (the Linear's weight and bias, 16,640 bytes in 512-byte blocks):
    # `communication`, beside the gradients themselves
    assert data["breakdown"]["communication"] == 33 * 512, data["breakdown"]
    for rank in range(4):
        assert f"rank {rank} local {rank} args ['--x', '1']" in result.stderr, result.stderr[-4000:]


def test_nproc_per_node_option_on_a_plain_command(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(UNEVEN))
    result = cli(tmp_path, "--json", "--mode", "fake", "--nproc-per-node", "4", "--", "python",
                 "train.py")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["traced_ranks"] == [0] and data["world_size"] == 4
    assert "rank 0 local 0" in result.stderr


def test_bad_distributed_input_is_one_json_error(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    for args, code in (
        (["--ranks", "7", "--", "torchrun", "--nproc-per-node", "2", "train.py"], 2),
        (["--ranks", "all", "--", "python", "train.py"], 2),
        (["--", "torchrun", "--nproc-per-node", "2", "missing.py"], 2),
        (["--", "torchrun", "--no-python", "--nproc-per-node", "2", "ls"], 3),
    ):
        result = cli(tmp_path, "--json", *args)
        assert result.returncode == code, (args, result.stdout, result.stderr[-2000:])
        error = json.loads(result.stdout)["error"]
        assert error["exit_code"] == code and "\n" not in error["message"]

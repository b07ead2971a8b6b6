"""DTensor tensor and sequence parallelism (`parallelize_module` over `init_device_mesh`) under
the fake process group: each rank's parameters, gradients and Adam state are its local shards
(torch.chunk's split of the sharded dim: uneven sizes leave the last ranks fewer rows, or none),
replicated parameters whole, to the byte."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.test_ddp import set_world

ROOT = Path(__file__).resolve().parents[2]

IN, HIDDEN, OUT = 64, 256, 250
# OUT does not divide by 4: torch.chunk gives 63, 63, 63, 61 rows. A Colwise -> Rowwise pair needs
# an even HIDDEN (RowwiseParallel rebuilds its input with DTensor.from_local, which assumes even
# shards: real PyTorch fails the same way on an uneven one).


CHILD = """
import json, sys
from collections import Counter
from peakmem.capture import capture_callable
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations
from tests.distributed import test_tensor_parallel as tp
result = capture_callable(getattr(tp, sys.argv[1])(int(sys.argv[2])), gpu=load_gpu("a100-40gb"),
                          stack=load_stack("2.4.1"), steps=2)
totals, sizes = Counter(), Counter()
for size, tag in allocations(result.trace):
    totals[tag.category] += size
    sizes[str(size)] += 1
print(json.dumps({"error": result.error_text if result.error else None, "totals": totals,
                  "sizes": sizes,
                  "nccl": result.libraries.get("nccl", 0), "notes": result.notes}))
"""


def capture_rank(job: str, world: int, rank: int, monkeypatch) -> dict:
    """The capture of one rank in a process of its own, as `peakmem estimate` runs each rank:
    DTensor caches sharding decisions per process by op schema, whose key holds neither the rank
    nor its device, so ranks captured one after another in one process would share them."""
    set_world(monkeypatch, world, rank=rank)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", CHILD, job, str(world)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["error"] is None, found["error"]
    return found


def held(size: int, world: int, rank: int) -> int:
    """The rows of a dim of `size` that `rank` holds when DTensor shards it (torch.chunk)."""
    chunks = torch.arange(size).chunk(world)
    return len(chunks[rank]) if rank < len(chunks) else 0


def tp_job(world: int, steps: int = 2):
    def job():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cuda", (world,))  # no init_process_group: the mesh makes one
        net = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                                  torch.nn.Linear(HIDDEN, IN), torch.nn.Linear(IN, OUT)).cuda()
        parallelize_module(net, mesh, {
            "0": ColwiseParallel(),
            "2": RowwiseParallel(),
            # uneven: all-gathered with padding, unpadded to the whole output
            "3": ColwiseParallel(output_layouts=Replicate()),
        })
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        for _ in range(steps):
            net(torch.randn(8, IN, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return job


def tp_local_bytes(world: int, rank: int, padded: bool = False) -> int:
    """The rank's local tensors; `padded`: their storages, where a Shard(0) parameter is a view
    of distribute_tensor's scatter output, padded to the first rank's rows (its narrow to the
    rows held is contiguous, so nothing copies it; a Shard(1) narrow is copied)."""
    rows = held(HIDDEN, world, rank)
    out = held(OUT, world, 0) if padded else held(OUT, world, rank)
    colwise = rows * IN + rows  # weight Shard(0), bias Shard(0)
    rowwise = IN * rows + IN  # weight Shard(1), bias replicated (whole)
    last = out * IN + out  # Shard(0), uneven
    return 4 * (colwise + rowwise + last)


@pytest.mark.parametrize(("world", "rank"), [(2, 1), (4, 0), (4, 3)])
def test_tensor_parallel_state_is_the_local_shard(monkeypatch, world, rank):
    result = capture_rank("tp_job", world, rank, monkeypatch)
    totals = result["totals"]
    local, padded = tp_local_bytes(world, rank), tp_local_bytes(world, rank, padded=True)
    assert totals["parameter"] == padded
    assert totals["optimizer_state"] == 2 * local  # exp_avg and exp_avg_sq, like each shard
    assert totals["gradient"] == 2 * local  # one set per step (zero_grad frees them)
    if rank == world - 1 and OUT % world:
        assert padded > local
    # the uneven layer's output all-gather: world x the padded shard (8 rows of the batch), once
    # per forward pass
    gathered = 4 * world * 8 * held(OUT, world, 0)
    assert result["sizes"].get(str(gathered), 0) >= 2
    assert result["nccl"] > 0
    assert any(f"world size {world} (this is rank {rank})" in note for note in result["notes"])


def test_last_rank_holds_fewer_rows_than_the_first():
    assert tp_local_bytes(4, 3) < tp_local_bytes(4, 0)  # 61 rows of the last layer against 63


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(IN)
        self.up = torch.nn.Linear(IN, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, IN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def sp_job(world: int):
    def job():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cuda", (world,))
        block = Block().cuda()
        parallelize_module(block, mesh, {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
        })
        optimizer = torch.optim.Adam(block.parameters(), lr=1e-3)
        for _ in range(2):
            # this rank's slice of the sequence (Shard(1))
            block(torch.randn(2, 16 // world, IN, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return job


@pytest.mark.parametrize(("world", "rank"), [(2, 0), (4, 3)])
def test_sequence_parallel_norm_is_replicated(monkeypatch, world, rank):
    totals = capture_rank("sp_job", world, rank, monkeypatch)["totals"]
    rows = held(HIDDEN, world, rank)
    local = 4 * (2 * IN  # LayerNorm weight and bias, whole on every rank
                 + rows * IN + rows  # up: Shard(0)
                 + IN * rows + IN)  # down: weight Shard(1), bias whole
    assert totals["parameter"] == local
    assert totals["optimizer_state"] == 2 * local
    assert totals["gradient"] == 2 * local


def fsdp_tp_job(world: int):
    """2-D parallelism (torchtitan's layout): tensor parallel within pairs of ranks, FSDP2 over
    the other mesh dim."""
    def job():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cuda", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        net = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                                  torch.nn.Linear(HIDDEN, IN)).cuda()
        parallelize_module(net, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(net, mesh=mesh["dp"])
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        for _ in range(2):
            net(torch.randn(8, IN, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return job


def test_fsdp_over_tensor_parallel_holds_both_shards(monkeypatch):
    world = 4
    totals = capture_rank("fsdp_tp_job", world, 3, monkeypatch)["totals"]
    dp, tp = world // 2, 2
    local = 4 * (HIDDEN // tp // dp * IN + HIDDEN // tp // dp  # Colwise, then FSDP on dim 0
                 + IN // dp * (HIDDEN // tp) + IN // dp)  # Rowwise (bias replicated), FSDP
    assert totals["parameter"] == local
    assert totals["optimizer_state"] == 2 * local
    assert totals["gradient"] == 2 * local


TP_SCRIPT = """
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

mesh = init_device_mesh("cuda", (4,))
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64),
                          torch.nn.Linear(64, 250)).cuda()
parallelize_module(net, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(),
                               "3": ColwiseParallel(output_layouts=Replicate())})
optimizer = torch.optim.Adam(net.parameters())
for _ in range(2):
    net(torch.randn(8, 64, device="cuda")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_torchrun_tensor_parallel_every_rank(tmp_path):
    """End to end: `torchrun` of a tensor-parallel script, every rank traced in its own child;
    the last rank holds fewer rows of the uneven layer (its Adam state and gradients are
    smaller), so rank 0 is the largest."""
    from tests.distributed.test_cli_distributed import cli

    (tmp_path / "train.py").write_text(TP_SCRIPT)
    result = cli(tmp_path, "--json", "--mode", "fake", "--ranks", "all", "--", "torchrun",
                 "--nproc-per-node", "4", "train.py")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["world_size"] == 4 and [row["rank"] for row in data["ranks"]] == [0, 1, 2, 3]
    peaks = {row["rank"]: row["peak_allocated_bytes"] for row in data["ranks"]}
    assert peaks[0] == peaks[1] == peaks[2] > peaks[3]
    assert data["largest_rank"] == 0

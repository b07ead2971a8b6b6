"""FSDP2 (`fully_shard`) and FSDP1 under the fake process group: each rank's parameters,
gradients and optimizer state are its shard of the model (1/N plus padding), to the byte."""

import math
from collections import Counter

import pytest
import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations
from tests.distributed.test_ddp import set_world

# uneven dim-0 sizes, so that sharding pads
SHAPES = [(250, 256), (256, 250), (250, 256)]


def model() -> torch.nn.Module:
    return torch.nn.Sequential(*(torch.nn.Linear(cols, rows) for rows, cols in SHAPES))


def fsdp2_job(steps: int = 2):
    def job():
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl")
        net = model().cuda()
        for layer in net:
            fully_shard(layer)
        fully_shard(net)
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        for _ in range(steps):
            net(torch.randn(8, SHAPES[0][1], device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return job


def fsdp1_job():
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    dist.init_process_group("nccl")
    net = FullyShardedDataParallel(model().cuda(), device_id=0)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(2):
        net(torch.randn(8, SHAPES[0][1], device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def by_category(result) -> Counter:
    totals = Counter()
    for size, tag in allocations(result.trace):
        totals[tag.category] += size
    return totals


def fsdp2_shard_bytes(world: int, rank: int | None = None) -> int:
    """fully_shard pads every parameter's dim 0 to a multiple of the world size; `rank`: the
    rows that rank really holds (the last ranks hold fewer), without the padding."""
    total = 0
    for rows, cols in SHAPES:
        chunk = math.ceil(rows / world)
        held = chunk if rank is None else max(0, min(chunk, rows - rank * chunk))
        total += 4 * (held * cols + held)  # weight and bias shards
    return total


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fsdp2_per_rank_state_is_the_padded_shard(monkeypatch, a100, stack24, world):
    set_world(monkeypatch, world, rank=world - 1)  # the last rank: its shards are padded too
    result = capture_callable(fsdp2_job(), gpu=a100, stack=stack24, steps=2)
    assert result.error is None, result.error_text
    totals = by_category(result)
    shard, held = fsdp2_shard_bytes(world), fsdp2_shard_bytes(world, rank=world - 1)
    assert totals["parameter"] == shard  # the padded shard is the parameter's storage
    # Adam's exp_avg and exp_avg_sq are like the parameter's local tensor: the rows the rank
    # holds (the last ranks hold fewer)
    assert totals["optimizer_state"] == 2 * held
    # each step's gradients are views of its reduce-scatter output: the padded shard
    assert totals["gradient"] == 2 * shard
    full = sum(4 * (rows * cols + rows) for rows, cols in SHAPES)
    assert shard * world >= full and shard * world - full < 4 * world * 2 * 256 * len(SHAPES)
    if world > 1:
        assert result.libraries.get("nccl", 0) > 0
        assert any("world size" in note for note in result.notes)


def test_fsdp2_all_gather_buffers_are_the_unsharded_layer(monkeypatch, a100, stack24):
    """Forward and backward all-gather each layer into one buffer of world x its padded shard
    (ProcessGroup all-gather into a preallocated output, freed once the layer reshards)."""
    world = 4
    set_world(monkeypatch, world)
    result = capture_callable(fsdp2_job(steps=1), gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    sizes = Counter(size for size, _ in allocations(result.trace))
    for rows, cols in SHAPES:
        padded = math.ceil(rows / world)
        assert sizes[4 * world * (padded * cols + padded)] >= 2


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
@pytest.mark.parametrize("world", [1, 3])
def test_fsdp1_flat_parameter_is_one_padded_shard(monkeypatch, a100, stack24, world):
    set_world(monkeypatch, world)
    result = capture_callable(fsdp1_job, gpu=a100, stack=stack24, steps=2)
    assert result.error is None, result.error_text
    numel = sum(rows * cols + rows for rows, cols in SHAPES)
    shard = 4 * math.ceil(numel / world)  # the flat parameter is padded to divide evenly
    totals = by_category(result)
    assert totals["parameter"] == shard
    assert totals["optimizer_state"] == 2 * shard
    assert totals["gradient"] == 2 * shard
